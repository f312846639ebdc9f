"""What a memory-budget test raises: a budget exceeded, or a test that cannot check one.

Stdlib only (and tracer.errors): the pytest plugin names these without
importing the query layer.
"""

from __future__ import annotations

from tracer.errors import TracerError

__all__ = ["MemoryBudgetError", "TracedMemoryError"]


class MemoryBudgetError(AssertionError):
    """Tasks used more memory than the test allows: the failure of a budget assertion.

    An :class:`AssertionError`, so pytest reports it as the test failing (not
    as an error in the test), with the message listing the worst tasks.
    """


class TracedMemoryError(TracerError, RuntimeError):
    """The test cannot check a budget: a bad budget or stage name, a block with no traced
    task, a trace not at level 2. Never a silent pass: the test fails with this."""

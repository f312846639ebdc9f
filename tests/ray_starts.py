"""Starting Ray in the tests: a start-up that fails is tried once more, with a warning.

Ray's own start-up, not ours: once in a CI run on this 2-core machine a
node's raylet never registered (Ray waits 30 s, then raises "The current
node timed out during startup") and left no log of its own. A Ray that will
not start says nothing about the tracer; a second start does, and the
warning keeps the first failure visible in the test report.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: How many times Ray (a local instance, a cluster, a node) is started before giving up.
STARTS = 2


def started(start: Callable[[], T], what: str) -> T:
    """``start()``, called again if it raises (at most :data:`STARTS` times in all).

    ``start`` must leave nothing behind when it raises (a half-started Ray is
    shut down by it), so that the next call starts afresh.
    """
    for attempt in range(1, STARTS + 1):
        try:
            return start()
        except Exception as exc:
            if attempt == STARTS:
                raise
            warnings.warn(f"{what} did not start, starting again: {exc}", stacklevel=2)
    raise AssertionError("unreachable")

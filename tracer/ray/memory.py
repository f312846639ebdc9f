"""Level-2 memory measurement of one task (filled in by the memory work)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def track_task_memory(metrics: dict[str, Any], *, native_traces: bool = False) -> Iterator[None]:
    """Placeholder: level 2 currently records the same as level 1."""
    yield

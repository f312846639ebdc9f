"""Stage functions with known shapes for the query tests (imported by Ray workers by name)."""

from __future__ import annotations

import time
from pathlib import Path

MIB = 1 << 20
PARTITIONS = 6
SLEEP_S = 0.25
ALLOC_BYTES = 64 * MIB
# Far below any worker's RSS (every sleep task is over at level 1), and far
# above memray's heap peak for a sleep at level 2: memray counts the heap of
# the worker's own threads too, measured 0.3-1.4 MiB under load.
SLEEP_REQUEST = 8 * MIB
ALLOC_REQUEST = 1 << 30  # far above what alloc uses
BAD_PARTITION = 3


def sleep(x: int) -> int:
    time.sleep(SLEEP_S)
    return x


def alloc(x: int) -> int:
    buffer = bytearray(ALLOC_BYTES)
    buffer[:: 4096] = b"\x01" * len(buffer[:: 4096])  # touch every page: RSS grows too
    return x + len(buffer) - ALLOC_BYTES


def boom(x: int) -> int:
    if x == BAD_PARTITION:
        raise ValueError(f"partition {x} is bad")
    return x


def run(path: Path, level: int) -> Path:
    """A traced run: sleep (8 MiB asked) -> alloc (1 GiB asked) -> boom (nothing asked)."""
    import pytest

    from tracer.runner import Pipeline, Stage

    stages = [
        Stage("sleep", sleep, memory_bytes=SLEEP_REQUEST),
        Stage("alloc", alloc, memory_bytes=ALLOC_REQUEST),
        Stage("boom", boom, max_retries=0),
    ]
    with pytest.raises(ValueError, match="partition 3 is bad"):
        Pipeline(list(range(PARTITIONS)), stages).run(
            tracing_level=level, trace_path=path, progress=False
        )
    return path

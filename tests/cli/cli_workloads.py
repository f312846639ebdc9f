"""A small traced run for the CLI tests (Ray workers import these functions by name)."""

from __future__ import annotations

import time
from pathlib import Path

MIB = 1 << 20
PARTITIONS = 4


def nap(x: int) -> int:
    time.sleep(0.05)
    return x


def grow(x: int) -> int:
    return len(bytearray(8 * MIB)) + x


def run(path: Path) -> Path:
    from tracer.runner import Pipeline, Stage

    stages = [Stage("nap", nap, memory_bytes=MIB), Stage("grow", grow, memory_bytes=1 << 30)]
    Pipeline(list(range(PARTITIONS)), stages).run(tracing_level=1, trace_path=path,
                                                  progress=False)
    return path

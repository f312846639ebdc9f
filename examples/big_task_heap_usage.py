"""A pipeline whose tasks blow their data up and shrink it again: trace how big they get.

    python examples/big_task_heap_usage.py [--num-partitions N] [--num-rows-per-partition R]
        [--inflation-factor F] [--deflation-factor D] [--request-factor Q]
        [--tracing-level 0|1|2] [--trace-out PATH]

Partitions are made on the workers by a generator of factories: each is R
rows of 64 random-looking bytes, one numpy uint8 array (numpy comes with
pandas, one of tracer's dependencies). The stage "inflate" (a UDF) repeats
every row F times, so its output is F times bigger than its input; "deflate"
keeps the first 1/D of every row. Each stage asks Ray for Q times the size of
its input (``Stage(..., memory_bytes=...)``, which the runner passes to Ray as
``memory=``; a common rule of thumb), which is far too little for "inflate".
At tracing level 1 (the default, or ``$TRACER_ENABLE_RAY_TRACING`` when set)
every task's execution slice shows its worker's RSS peak next to its
requested memory; at level 2 memray measures each task's real heap peak, and
the tasks whose peak exceeds their request are flagged (``over_request``). At
the end the script prints what ``tracer memory --suggest`` prints for the
trace (``tracer.cli.memory.memory_report``): requested vs actual memory per
stage and per node, the tasks over their request, and the memory each stage
should request instead.

It runs on the cluster named by ``$RAY_ADDRESS``, or on a local Ray it starts
(2 CPUs, an object store sized for the data). The trace goes to
``--trace-out``, or by default to the Ray session's log folder; the script
prints where. Open it at https://ui.perfetto.dev ("Open trace file") or with
``tracer open PATH``.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import ray

from tracer.cli.memory import memory_report
from tracer.errors import InvalidTracingLevelError
from tracer.ray import ENV_VAR as LEVEL_ENV_VAR
from tracer.ray import TracingLevel, resolve_level
from tracer.runner import Pipeline, Stage

ROW_BYTES = 64
MIB = 1 << 20


def make_partition(index: int, num_rows: int) -> np.ndarray:
    """``num_rows`` rows of ROW_BYTES bytes (one uint8 array), different for every partition."""
    rng = random.Random(index)
    data = rng.randbytes(num_rows * ROW_BYTES)
    return np.frombuffer(data, dtype=np.uint8).reshape(num_rows, ROW_BYTES).copy()


def partitions(num_partitions: int, num_rows: int) -> Iterator[Callable[[], np.ndarray]]:
    """Zero-argument factories: each partition is built inside its first task."""
    for index in range(num_partitions):
        yield lambda index=index: make_partition(index, num_rows)


def inflate(rows: np.ndarray, factor: int) -> np.ndarray:
    """Every row's bytes repeated ``factor`` times: the partition grows ``factor``-fold."""
    return np.tile(rows, (1, factor))


def deflate(rows: np.ndarray, factor: int) -> np.ndarray:
    """Every row cut to 1/``factor`` of its length (a copy: the cut is its own data)."""
    return rows[:, : max(1, rows.shape[1] // factor)].copy()


def object_store_bytes(num_partitions: int, num_rows: int, inflation: int, deflation: int) -> int:
    """Room for a few inflated partitions in flight plus every deflated result."""
    partition = num_rows * ROW_BYTES
    inflated = partition * inflation
    needed = 4 * inflated + num_partitions * (inflated // max(1, deflation) + partition)
    return int(min(max(2 * needed, 80 * MIB), 4096 * MIB))


def start_ray(object_store_memory: int) -> None:
    """Join the cluster named by $RAY_ADDRESS, else start a local Ray."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
    else:
        ray.init(
            address="local",
            num_cpus=2,
            object_store_memory=object_store_memory,
            include_dashboard=False,
        )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _no_trace(level: TracingLevel) -> str:
    if level == TracingLevel.OFF:
        return "tracing is off (level 0): no trace written"
    return "no trace written: the trace file could not be written (the warning above says why)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--num-partitions", type=_positive, default=8,
        help="how many partitions, one task per stage each (default %(default)s)",
    )
    parser.add_argument(
        "--num-rows-per-partition", type=_positive, default=200_000,
        help=f"rows of {ROW_BYTES} bytes in each partition (default %(default)s)",
    )
    parser.add_argument(
        "--inflation-factor", type=_positive, default=16,
        help="'inflate' repeats every row this many times (default %(default)s)",
    )
    parser.add_argument(
        "--deflation-factor", type=_positive, default=8,
        help="'deflate' keeps 1/this of every row (default %(default)s)",
    )
    parser.add_argument(
        "--request-factor", type=_positive, default=2,
        help="each stage requests this many times its input size as memory, "
        "Stage(memory_bytes=...) (default %(default)s)",
    )
    parser.add_argument(
        "--tracing-level", default=None, metavar="LEVEL",
        help=f"0 (off), 1 (timeline) or 2 (memory); default: ${LEVEL_ENV_VAR} when set, else 1",
    )
    parser.add_argument(
        "--trace-out", type=Path, default=None,
        help="trace file (default: <Ray session>/logs/tracer/...)",
    )
    args = parser.parse_args()
    try:  # checked before Ray starts: 0/1/2 or off/timeline/memory
        args.tracing_level = resolve_level(args.tracing_level, default=TracingLevel.TIMELINE)
    except InvalidTracingLevelError as exc:
        parser.error(str(exc))
    n, rows = args.num_partitions, args.num_rows_per_partition
    inflation, deflation = args.inflation_factor, args.deflation_factor

    partition_bytes = rows * ROW_BYTES
    pipeline = Pipeline(
        partitions(n, rows),
        [
            Stage(
                "inflate", lambda part: inflate(part, inflation),
                memory_bytes=args.request_factor * partition_bytes,
            ),
            Stage(
                "deflate", lambda part: deflate(part, deflation),
                memory_bytes=args.request_factor * partition_bytes * inflation,
            ),
        ],
    )
    start_ray(object_store_bytes(n, rows, inflation, deflation))
    start = time.monotonic()
    results = pipeline.run(tracing_level=args.tracing_level, trace_path=args.trace_out)
    elapsed = time.monotonic() - start

    size_in = n * rows * ROW_BYTES
    size_out = sum(part.nbytes for part in results)
    print(
        f"{n} partitions of {rows} rows: {size_in / MIB:.1f} MiB in, "
        f"{size_in * inflation / MIB:.1f} MiB after inflate (x{inflation}), "
        f"{size_out / MIB:.1f} MiB after deflate (/{deflation}); {elapsed:.1f} s"
    )
    if pipeline.trace_path is None:
        print(_no_trace(args.tracing_level))
        return
    print(memory_report(pipeline.trace_path, suggest=True))
    print(f"trace written to {pipeline.trace_path}")
    print("open it at https://ui.perfetto.dev (Open trace file), or run:")
    print(f"  tracer open {pipeline.trace_path}")


if __name__ == "__main__":
    main()

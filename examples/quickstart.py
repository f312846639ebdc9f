"""Trace a three-stage pipeline on Ray and print where the trace is.

    python examples/quickstart.py [--num-partitions N] [--tracing-level 0|1|2] [--trace-out PATH]

It runs tracer's reference runner (``tracer.runner.Pipeline``) on the Ray
cluster named by ``$RAY_ADDRESS``, or on a local Ray it starts (2 CPUs), at
tracing level ``--tracing-level``, else ``$TRACER_ENABLE_RAY_TRACING`` when set,
else 1. The trace goes to ``--trace-out``, or by default to the Ray session's log folder
(``<session>/logs/tracer/``). Open it at https://ui.perfetto.dev ("Open trace
file"), or with ``tracer open PATH``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import ray

from tracer.errors import InvalidTracingLevelError
from tracer.ray import ENV_VAR as LEVEL_ENV_VAR
from tracer.ray import TracingLevel, resolve_level
from tracer.runner import Pipeline, Stage


def tokenize(line: str) -> list[str]:
    return line.lower().split()


def count_words(words: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for word in words:
        counts[word] = counts.get(word, 0) + 1
    time.sleep(0.05)  # pretend this is real work, so tasks overlap in the trace
    return counts


def top_word(counts: dict[str, int]) -> tuple[str, int]:
    return max(counts.items(), key=lambda kv: (kv[1], kv[0]))


def start_ray() -> None:
    """Join the cluster named by $RAY_ADDRESS, else start a small local Ray."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
    else:
        ray.init(
            address="local", num_cpus=2, object_store_memory=78643200, include_dashboard=False
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
        "--num-partitions", type=_positive, default=12,
        help="how many lines of text, one task per stage each (default %(default)s)",
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

    lines = [
        f"the quick brown fox {i} jumps over the lazy dog the end {'fox ' * (i % 3)}"
        for i in range(args.num_partitions)
    ]
    pipeline = Pipeline(
        lines,
        [
            Stage("tokenize", tokenize),
            Stage("count words", count_words),
            Stage("top word", top_word, num_cpus=0.5),
        ],
    )
    start_ray()
    results = pipeline.run(tracing_level=args.tracing_level, trace_path=args.trace_out)
    print(f"{len(results)} partitions; top word of the first: {results[0]}")
    if pipeline.trace_path is None:
        print(_no_trace(args.tracing_level))
        return
    print(f"trace written to {pipeline.trace_path}")
    print("open it at https://ui.perfetto.dev (Open trace file), or run:")
    print(f"  tracer open {pipeline.trace_path}")


if __name__ == "__main__":
    main()

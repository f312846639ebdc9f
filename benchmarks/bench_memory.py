"""What level 2 (memray around every task) costs compared with level 1.

Run by hand (it is not a test), from the project root:

    .venv/bin/python benchmarks/bench_memory.py                 # ~2 min on 2 cores
    .venv/bin/python benchmarks/bench_memory.py --repeats 1 --trivial-tasks 300   # quick look

It starts one local Ray (``--num-cpus``, default 2) and runs, at tracing
levels 1 and 2, the levels alternated in every repetition after a warm-up:

* the **mock workload** of ``examples/big_task_heap_usage.py`` (its defaults:
  8 partitions of 200,000 rows of 64 bytes, inflate x16 then deflate /8, each
  stage requesting 2x its input), ``--repeats`` times (5);
* the same with ``--big-rows`` (400,000) rows per partition,
  ``--big-repeats`` times (3; 0 skips it);
* ``--trivial-tasks`` (2000) trivial tasks (one no-op stage),
  ``--trivial-repeats`` times (1; level 2 pays memray's start and stop,
  ~20 ms, on every task, so this takes a while).

It prints the median wall times, the ratio level 2 / level 1 and the extra
time per task for each, then sizes from the mock workload's level-2 trace:
bytes per memory counter value (worker heap/RSS, node requested/used, before
compression) and bytes of memory annotations per task. Target: level 2 <= 1.5x
level 1 on the mock workload, checked at both sizes (PASS/FAIL; exit status 1
on a FAIL).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import ray

from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.cli.memory import memory_report
from tracer.format import TraceWriter, read_trace
from tracer.ray import layout as L
from tracer.runner import Pipeline, Stage

TARGET_MOCK_RATIO = 1.5
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "big_task_heap_usage.py"
MEMORY_ARGS = {
    L.ARG_MEMORY_REQUESTED, L.ARG_MEMORY_PEAK, L.ARG_OVER_REQUEST, L.ARG_HEAP_PEAK,
    L.ARG_ALLOCATIONS, L.ARG_HEAP_RETAINED, L.ARG_RSS_PEAK, L.ARG_MEMRAY, L.ARG_MEMRAY_REASON,
}


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("big_task_heap_usage", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Ray pickles its functions by reference
    spec.loader.exec_module(module)
    return module


def noop(x: int) -> int:
    return x


# ------------------------------------------------------------------ workloads


def mock_workload(example: ModuleType, partitions: int, rows: int) -> Callable[[], Pipeline]:
    """The example's pipeline with its default factors and requests."""
    inflation, deflation, request_factor = 16, 8, 2
    partition_bytes = rows * example.ROW_BYTES

    def make() -> Pipeline:
        return Pipeline(
            example.partitions(partitions, rows),
            [
                Stage(
                    "inflate", lambda part: example.inflate(part, inflation),
                    memory_bytes=request_factor * partition_bytes,
                ),
                Stage(
                    "deflate", lambda part: example.deflate(part, deflation),
                    memory_bytes=request_factor * partition_bytes * inflation,
                ),
            ],
        )

    return make


def trivial_workload(tasks: int) -> Callable[[], Pipeline]:
    return lambda: Pipeline(list(range(tasks)), [Stage("noop", noop)])


def run_once(make: Callable[[], Pipeline], level: int, path: Path) -> float:
    path.unlink(missing_ok=True)
    pipeline = make()
    start = time.perf_counter()
    pipeline.run(tracing_level=level, trace_path=path, progress=False, fetch=False)
    return time.perf_counter() - start


def bench(
    name: str, make: Callable[[], Pipeline], repeats: int, folder: Path
) -> dict[int, list[float]]:
    times: dict[int, list[float]] = {1: [], 2: []}
    for level in (1, 2):  # warm-up: workers started, functions exported
        run_once(make, level, folder / f"{name}-warmup.perfetto-trace")
    for i in range(repeats):
        for level in ((1, 2) if i % 2 == 0 else (2, 1)):
            elapsed = run_once(make, level, folder / f"{name}-{level}.perfetto-trace")
            times[level].append(elapsed)
            print(f"  {name:<8} level {level}: {elapsed:7.2f} s", flush=True)
    return times


# ---------------------------------------------------------------------- sizes


def counter_bytes(path: Path) -> tuple[int, int]:
    """Bytes (uncompressed) and values of the memory counter packets (sequences other than 1)."""
    packets = []
    for outer in pb.Trace.FromString(path.read_bytes()).packet:
        if outer.HasField("compressed_packets"):  # runner traces are compressed by default
            packets.extend(pb.Trace.FromString(zlib.decompress(outer.compressed_packets)).packet)
        else:
            packets.append(outer)
    total = values = 0
    for packet in packets:
        if packet.trusted_packet_sequence_id == 1 or not packet.HasField("track_event"):
            continue
        event = packet.track_event
        if event.type != pb.TrackEvent.TYPE_COUNTER:
            continue
        total += packet.ByteSize() + 2
        values += 1 + len(event.extra_counter_values)
    return total, values


def annotation_bytes(args: dict[str, Any], folder: Path) -> int:
    """What ``args`` add to a slice once their names are interned."""
    w = TraceWriter(folder / "size.perfetto-trace", clock=lambda: 1)
    track = w.track("t")
    w.complete(track, "n", 1, 2, args=args)
    n0 = len(w._buf)
    w.complete(track, "n", 3, 4, args=args)
    n1 = len(w._buf)
    w.complete(track, "n", 5, 6)
    n2 = len(w._buf)
    w.close()
    return (n1 - n0) - (n2 - n1)


# ----------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="mock workload runs per level")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--big-rows", type=int, default=400_000)
    parser.add_argument("--big-repeats", type=int, default=3)
    parser.add_argument("--trivial-tasks", type=int, default=2000)
    parser.add_argument("--trivial-repeats", type=int, default=1)
    args = parser.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    example = load_example()
    rows = max(args.rows, args.big_rows if args.big_repeats else 0)
    store = example.object_store_bytes(args.partitions, rows, 16, 8)
    ray.init(
        address="local", num_cpus=args.num_cpus, object_store_memory=store,
        include_dashboard=False, log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(EXAMPLE.parent)}},
    )
    results: list[tuple[str, int, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"mock workload: {args.partitions} partitions x {args.rows} rows, 2 stages")
        mock = bench("mock", mock_workload(example, args.partitions, args.rows),
                     args.repeats, folder)
        mock_tasks = 2 * args.partitions
        results.append(("mock", mock_tasks, statistics.median(mock[1]),
                        statistics.median(mock[2])))
        level2_trace = folder / "mock-2.perfetto-trace"
        model = read_trace(level2_trace)
        report = memory_report(level2_trace)
        total, values = counter_bytes(level2_trace)
        executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
        costs = [
            annotation_bytes({k: v for k, v in s.args.items() if k in MEMORY_ARGS}, folder)
            for s in executions
        ]
        size = level2_trace.stat().st_size
        if args.big_repeats:
            print(f"mock-big: {args.partitions} partitions x {args.big_rows} rows, 2 stages")
            big = bench("mock-big", mock_workload(example, args.partitions, args.big_rows),
                        args.big_repeats, folder)
            results.append(("mock-big", mock_tasks, statistics.median(big[1]),
                            statistics.median(big[2])))
        if args.trivial_tasks and args.trivial_repeats:
            print(f"trivial: {args.trivial_tasks} no-op tasks")
            trivial = bench("trivial", trivial_workload(args.trivial_tasks),
                            args.trivial_repeats, folder)
            results.append(("trivial", args.trivial_tasks, statistics.median(trivial[1]),
                            statistics.median(trivial[2])))
    ray.shutdown()

    print()
    print(f"{'workload':<9} {'tasks':>6} {'level 1':>9} {'level 2':>9} {'ratio':>6} "
          f"{'extra per task':>15}")
    for name, tasks, t1, t2 in results:
        extra = (t2 - t1) / tasks * 1000
        print(f"{name:<9} {tasks:>6} {t1:>8.2f}s {t2:>8.2f}s {t2 / t1:>5.2f}x {extra:>11.1f} ms"
              f"  (x{args.num_cpus} CPUs: {extra * args.num_cpus:.1f} ms of worker time)")
    print()
    print(report)
    print()
    print(f"mock level-2 trace: {size} bytes, {size / mock_tasks:.0f} per task")
    print(f"memory counters: {total} bytes for {values} values, "
          f"{total / max(1, values):.1f} bytes per value")
    print(f"memory annotations per task: median {statistics.median(costs):.0f} bytes, "
          f"max {max(costs)} (target <= 200)")
    ok = True
    for name, _, t1, t2 in results:
        if not name.startswith("mock"):
            continue
        passed = t2 / t1 <= TARGET_MOCK_RATIO
        ok = ok and passed
        print(f"{'PASS' if passed else 'FAIL'}: {name} level 2 / level 1 = {t2 / t1:.2f}x "
              f"(target <= {TARGET_MOCK_RATIO}x)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""What level 2 (memray measuring every task) costs compared with level 1, before and after.

Run by hand (it is not a test), from the project root:

    .venv/bin/python benchmarks/bench_memory.py                 # ~4 min on 2 cores
    .venv/bin/python benchmarks/bench_memory.py --repeats 1 --trivial-tasks 300 \\
        --before-trivial-repeats 0 --fixed-iterations 40       # quick look

It starts one local Ray (``--num-cpus``, default 2) and measures, in one run:

1. **The fixed cost per task, in a Ray worker**, and where it goes, for both
   methods, in alternating blocks of ``--fixed-block`` tasks (``--fixed-iterations``
   in all): *before*, a ``memray.Tracker`` around each task (construct, start,
   stop, read the capture back with memray's ``FileReader``, delete the file:
   what level 2 did until now, and still does outside Ray workers); *after*,
   one tracker per worker process followed by tracer's live reader (start
   marker, end marker, reading the task's records, releasing the pages read,
   the figures). Medians with p10-p90, the ratio before / after, and the whole
   of ``measure_task`` with an empty body, level 2 minus level 1, for each.
2. **End to end**, the levels interleaved (every order of them in turn, so each
   follows each other equally often) after a warm-up, with ``--pause`` seconds
   between runs (more than the session's idle stop, so no run starts with the
   previous run's tracker): the mock
   workload of ``examples/big_task_heap_usage.py`` (8 partitions of 200,000 rows,
   inflate x16 then deflate /8, ``--repeats`` times) and ``--trivial-tasks``
   (2000) no-op tasks (``--trivial-repeats`` times), at level 1, level 2, and
   level 2 *before* (``TRACER_MEMRAY_PER_TASK=1`` in the tasks' runtime env;
   for the no-op tasks ``--before-trivial-repeats`` times, ~45 s each); with
   ``--big-repeats``, the mock workload again with ``--big-rows`` (400,000) rows.

Targets (PASS/FAIL; exit status 1 on a FAIL): no-op tasks, level 2 <= 2x
level 1; mock workload, level 2 <= 1.15x level 1. It also prints the
mock workload's memory table and its level-2 trace's sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
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
from tracer.ray.memory_session import PER_TASK_ENV
from tracer.runner import Pipeline, Stage

TARGET_TRIVIAL_RATIO = 2.0
TARGET_MOCK_RATIO = 1.15
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "big_task_heap_usage.py"
MEMORY_ARGS = {
    L.ARG_MEMORY_REQUESTED, L.ARG_MEMORY_PEAK, L.ARG_OVER_REQUEST, L.ARG_HEAP_PEAK,
    L.ARG_ALLOCATIONS, L.ARG_HEAP_RETAINED, L.ARG_RSS_PEAK, L.ARG_MEMRAY, L.ARG_MEMRAY_REASON,
}
#: The runs of the end-to-end part: name -> (tracing level, tracker per task).
RUNS = {"level 1": (1, False), "level 2": (2, False), "level 2 before": (2, True)}


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("big_task_heap_usage", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Ray pickles its functions by reference
    spec.loader.exec_module(module)
    return module


def noop(x: int) -> int:
    return x


def q(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))]


# ------------------------------------------------------- fixed cost per task

def _before_once(timings: dict[str, list[float]]) -> None:
    """One task's measurement by a tracker of its own, timed step by step
    (the steps of tracer.ray.memory's tracker per task, with an empty task)."""
    import uuid

    import memray

    from tracer.ray import memory

    clock = time.perf_counter
    t0 = clock()
    path = os.path.join(memory._capture_dir(), f"bench-{os.getpid()}-{uuid.uuid4().hex}.bin")
    tracker = memray.Tracker(
        destination=memray.FileDestination(path, overwrite=True, compress_on_exit=False),
        memory_interval_ms=memory.SNAPSHOT_INTERVAL_MS,
        file_format=memray.FileFormat.AGGREGATED_ALLOCATIONS,
    )
    t1 = clock()
    tracker.__enter__()
    t2 = clock()
    tracker.__exit__(None, None, None)
    t3 = clock()
    memory._read(path, {}, False)
    t4 = clock()
    memory._remove(path)
    t5 = clock()
    for name, value in (
        ("tracker construct (capture file created)", t1 - t0), ("tracker start", t2 - t1),
        ("tracker stop", t3 - t2), ("capture read back (FileReader)", t4 - t3),
        ("capture file deleted", t5 - t4),
    ):
        timings.setdefault(name, []).append(value)


def _after_once(timings: dict[str, list[float]]) -> None:
    """One task's measurement by the process's session, timed step by step
    (the steps of memory_session.Session.begin/end, with an empty task)."""
    import tracer.ray._memray_reader as R
    from tracer.ray import memory, memory_session

    session = memory_session._session
    assert session is not None
    reader = session.reader
    clock = time.perf_counter
    t0 = clock()
    session.begin()
    t1 = clock()
    start = session.start
    assert start is not None
    end = R.marker_alloc(start[1])
    t2 = clock()
    assert reader.advance(*start)
    reader.open_window()
    assert reader.advance(end, start[1])
    t3 = clock()
    peak, at_peak, retained, _, _, samples = reader.close_window()
    metrics: dict[str, Any] = {}
    memory.put_figures(metrics, peak, at_peak, retained, samples)
    t4 = clock()
    reader.release()
    R.marker_free(end)
    R.marker_free(start[0])
    session.start, session.busy = None, False
    t5 = clock()
    for name, value in (
        ("start marker", t1 - t0), ("end marker", t2 - t1),
        ("task's records read", t3 - t2), ("figures", t4 - t3),
        ("pages released, markers freed", t5 - t4),
    ):
        timings.setdefault(name, []).append(value)


def _measured_block(level: int) -> float:
    """measure_task with an empty body, as a traced task runs it: its whole time."""
    from tracer.ray.task_metrics import TaskContext, measure_task

    ctx = TaskContext("bench", "t", 0, level)
    t0 = time.perf_counter()
    with measure_task(ctx):
        pass
    return time.perf_counter() - t0


def _records_read_rate() -> tuple[int, float]:
    """What reading costs per record: a task making 10,000 allocations (and freeing
    them), its records read. (A no-op Ray task's own are ~1,000.)"""
    from tracer.ray import memory_session

    session = memory_session._session
    assert session is not None
    session.begin()
    blocks = [bytearray(600) for _ in range(10_000)]
    del blocks
    t0 = time.perf_counter()
    figures = session.end()
    return figures[4], time.perf_counter() - t0


@ray.remote
def fixed_cost(iterations: int, block: int) -> dict[str, Any]:
    """Runs in one Ray worker: both methods, alternating blocks of ``block`` tasks."""
    from tracer.ray import memory_session

    before: dict[str, list[float]] = {}
    after: dict[str, list[float]] = {}
    whole: dict[str, list[float]] = {"before": [], "after": []}
    starts: list[float] = []
    stops: list[float] = []
    rates: list[tuple[int, float]] = []
    for _ in range(3):  # warm-up: imports, first captures
        _measured_block(1)
        _measured_block(2)
    memory_session.stop()
    done = 0
    while done < iterations:
        n = min(block, iterations - done)
        os.environ[PER_TASK_ENV] = "1"  # before: a tracker per task
        for _ in range(n):
            _before_once(before)
            whole["before"].append(_measured_block(2) - _measured_block(1))
        del os.environ[PER_TASK_ENV]
        t0 = time.perf_counter()
        session = memory_session.begin(False)  # after: the session starts with a task...
        starts.append(time.perf_counter() - t0)
        assert not isinstance(session, str), session
        memory_session.end(session, {}, False)
        for _ in range(n):
            _after_once(after)
            whole["after"].append(_measured_block(2) - _measured_block(1))
        rates.append(_records_read_rate())
        t0 = time.perf_counter()
        memory_session.stop()  # ... and stops once idle
        stops.append(time.perf_counter() - t0)
        done += n
    return {
        "before": before, "after": after, "whole": whole, "session start": starts,
        "session stop": stops, "pid": os.getpid(), "rates": rates,
    }


def print_fixed_cost(result: dict[str, Any]) -> None:
    def ms(values: list[float]) -> str:
        return (f"{statistics.median(values) * 1e3:8.3f} ms  "
                f"({q(values, 10) * 1e3:.3f}-{q(values, 90) * 1e3:.3f})")

    n = len(result["whole"]["before"])
    print(f"Fixed cost per task in a Ray worker (pid {result['pid']}), {n} tasks per method "
          f"in alternating blocks: median (p10-p90)")
    for label, parts in (("before: a tracker per task", result["before"]),
                         ("after: one tracker per worker, read live", result["after"])):
        print(f"  {label}")
        for name, values in parts.items():
            print(f"    {name:<42} {ms(values)}")
        total = [sum(v) for v in zip(*parts.values(), strict=True)]
        print(f"    {'sum':<42} {ms(total)}")
    print("  after, once per worker process (and again after each idle stop)")
    print(f"    {'session start (tracker start, reader)':<42} {ms(result['session start'])}")
    print(f"    {'session stop (idle, exit)':<42} {ms(result['session stop'])}")
    whole = result["whole"]
    extra_before = statistics.median(whole["before"])
    extra_after = statistics.median(whole["after"])
    before_sum = sum(statistics.median(v) for v in result["before"].values())
    after_sum = sum(statistics.median(v) for v in result["after"].values())
    print(f"  ratio before / after (sums of the steps' medians): {before_sum * 1e3:.3f} / "
          f"{after_sum * 1e3:.3f} ms = {before_sum / after_sum:.0f}x")
    print("  measure_task with an empty body (the code a traced task runs), level 2 minus "
          "level 1, paired:")
    print(f"    before {ms(whole['before'])}")
    print(f"    after  {ms(whole['after'])}")
    if extra_after > 0:
        print(f"    ratio  {extra_before / extra_after:.0f}x")
    records = sum(n for n, _ in result["rates"])
    seconds = sum(t for _, t in result["rates"])
    print(f"  after, reading grows with the task's allocations: {seconds / records * 1e9:.0f} ns "
          f"per allocation record ({records} records read in tasks of 10,000 allocations); "
          "a no-op Ray task's own are ~1,000")
    print()


# ------------------------------------------------------------------ end to end


@dataclasses.dataclass(frozen=True)
class PerTaskStage(Stage):
    """A stage whose tasks run with ``TRACER_MEMRAY_PER_TASK=1``: level 2 *before*
    (Ray runs them in workers of their own, started with that environment)."""

    @property
    def ray_options(self) -> dict[str, Any]:
        return {**super().ray_options, "runtime_env": {"env_vars": {PER_TASK_ENV: "1"}}}


def mock_workload(example: ModuleType, partitions: int, rows: int) -> Callable[[bool], Pipeline]:
    """The example's pipeline with its default factors and requests."""
    inflation, deflation, request_factor = 16, 8, 2
    partition_bytes = rows * example.ROW_BYTES

    def make(per_task: bool) -> Pipeline:
        kind = PerTaskStage if per_task else Stage
        return Pipeline(
            example.partitions(partitions, rows),
            [
                kind("inflate", lambda part: example.inflate(part, inflation),
                     memory_bytes=request_factor * partition_bytes),
                kind("deflate", lambda part: example.deflate(part, deflation),
                     memory_bytes=request_factor * partition_bytes * inflation),
            ],
        )

    return make


def trivial_workload(tasks: int) -> Callable[[bool], Pipeline]:
    return lambda per_task: Pipeline(
        list(range(tasks)), [(PerTaskStage if per_task else Stage)("noop", noop)]
    )


def workers_cpu() -> float:
    """CPU seconds (user + system) used so far by this run's Ray worker processes.

    Less noisy than wall time on a shared machine: what level 2 adds runs in
    them. They are the children of the raylets this process started (other
    Ray instances on the machine have theirs).
    """
    parents: dict[int, int] = {}
    cpu: dict[int, int] = {}
    raylets = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, tail = stat.read_text().rsplit(")", 1)
        except (OSError, ValueError):
            continue
        pid, fields = int(stat.parent.name), tail.split()
        parents[pid] = int(fields[1])
        cpu[pid] = int(fields[11]) + int(fields[12])  # utime, stime
        if head.endswith("(raylet") and parents[pid] == os.getpid():
            raylets.add(pid)
    ticks = sum(cpu[pid] for pid, parent in parents.items() if parent in raylets)
    return ticks / os.sysconf("SC_CLK_TCK")


def run_once(
    make: Callable[[bool], Pipeline], run: str, path: Path, pause: float
) -> tuple[float, float]:
    """One run: its wall time and the CPU time its workers used, in seconds."""
    level, per_task = RUNS[run]
    time.sleep(pause)  # no tracker left from the previous run (the session's idle stop)
    path.unlink(missing_ok=True)
    pipeline = make(per_task)
    cpu = workers_cpu()
    start = time.perf_counter()
    pipeline.run(tracing_level=level, trace_path=path, progress=False, fetch=False)
    return time.perf_counter() - start, workers_cpu() - cpu


def bench(
    name: str, make: Callable[[bool], Pipeline], repeats: dict[str, int], folder: Path,
    pause: float, warm_up: Callable[[bool], Pipeline] | None = None,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall times and workers' CPU times of every run, by run."""
    runs = [run for run in RUNS if repeats.get(run, 0) > 0]
    times: dict[str, list[float]] = {run: [] for run in runs}
    cpus: dict[str, list[float]] = {run: [] for run in runs}
    for run in runs:  # warm-up: workers started, functions exported
        run_once(warm_up or make, run, folder / f"{name}-warmup.perfetto-trace", pause)
    # Every order of the runs in turn: each run follows each other one equally often
    # (what ran just before, e.g. the other worker pool's run, leaves costs behind).
    orders = list(itertools.permutations(runs))
    for i in range(max(repeats.values())):
        for run in orders[i % len(orders)]:
            if len(times[run]) >= repeats[run]:
                continue
            path = folder / f"{name}-{run.replace(' ', '-')}.perfetto-trace"
            elapsed, cpu = run_once(make, run, path, pause)
            times[run].append(elapsed)
            cpus[run].append(cpu)
            print(f"  {name:<8} {run:<15} {elapsed:7.2f} s  (workers' CPU {cpu:6.2f} s)",
                  flush=True)
    return times, cpus


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


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--fixed-iterations", type=int, default=200,
                        help="tasks per method in the fixed-cost part (0 skips it)")
    parser.add_argument("--fixed-block", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5, help="mock workload runs per level")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--big-rows", type=int, default=400_000)
    parser.add_argument("--big-repeats", type=int, default=0,
                        help="runs per level of the mock workload with --big-rows rows")
    parser.add_argument("--trivial-tasks", type=int, default=2000)
    parser.add_argument("--trivial-repeats", type=int, default=5)
    parser.add_argument("--before-trivial-repeats", type=int, default=1,
                        help="no-op runs with a tracker per task (~45 s each)")
    parser.add_argument("--pause", type=float, default=2.0,
                        help="seconds between runs (the session stops 1-1.5 s after its last task)")
    args = parser.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    example = load_example()
    rows = max(args.rows, args.big_rows if args.big_repeats else 0)
    store = example.object_store_bytes(args.partitions, rows, 16, 8)
    ray.init(
        address="local", num_cpus=args.num_cpus, object_store_memory=store,
        include_dashboard=False, log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(EXAMPLE.parent)}},
        # Keep idle workers: a worker's start (~0.25 s of CPU) would land in whichever
        # run it happens in; both methods' workers stay up between runs.
        _system_config={"idle_worker_killing_time_threshold_ms": 10**9},
    )
    if args.fixed_iterations:
        result = ray.get(fixed_cost.remote(args.fixed_iterations, args.fixed_block))
        print_fixed_cost(result)
    results: list[tuple[str, int, tuple[dict[str, list[float]], dict[str, list[float]]]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"mock workload: {args.partitions} partitions x {args.rows} rows, 2 stages")
        mock = bench("mock", mock_workload(example, args.partitions, args.rows),
                     dict.fromkeys(RUNS, args.repeats), folder, args.pause)
        mock_tasks = 2 * args.partitions
        results.append(("mock", mock_tasks, mock))
        level2_trace = folder / "mock-level-2.perfetto-trace"
        model = read_trace(level2_trace)
        report = memory_report(level2_trace)
        counter_total, counter_values = counter_bytes(level2_trace)
        executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
        costs = [
            annotation_bytes({k: v for k, v in s.args.items() if k in MEMORY_ARGS}, folder)
            for s in executions
        ]
        size = level2_trace.stat().st_size
        if args.big_repeats:
            print(f"mock-big: {args.partitions} partitions x {args.big_rows} rows, 2 stages")
            big = bench("mock-big", mock_workload(example, args.partitions, args.big_rows),
                        dict.fromkeys(RUNS, args.big_repeats), folder, args.pause)
            results.append(("mock-big", mock_tasks, big))
        if args.trivial_tasks and args.trivial_repeats:
            print(f"trivial: {args.trivial_tasks} no-op tasks")
            repeats = {"level 1": args.trivial_repeats, "level 2": args.trivial_repeats,
                       "level 2 before": args.before_trivial_repeats}
            trivial = bench("trivial", trivial_workload(args.trivial_tasks), repeats, folder,
                            args.pause, trivial_workload(min(args.trivial_tasks, 200)))
            results.append(("trivial", args.trivial_tasks, trivial))
    ray.shutdown()

    print()
    print("Wall time (median, min-max over the runs) and the CPU the Ray workers used per task")
    print(f"{'workload':<9} {'tasks':>6} {'run':<15} {'median':>8} {'min-max':>12} "
          f"{'/ level 1':>9} {'extra per task':>15} {'workers CPU/task':>17} {'extra':>9}")
    ratios: dict[str, float] = {}
    for name, tasks, (times, cpus) in results:
        base = statistics.median(times["level 1"])
        base_cpu = statistics.median(cpus["level 1"]) / tasks * 1e3
        for run, values in times.items():
            median = statistics.median(values)
            extra = (median - base) / tasks * 1000
            ratio = median / base
            if run == "level 2":
                ratios[name] = ratio
            cpu = statistics.median(cpus[run]) / tasks * 1e3
            extra_text = "" if run == "level 1" else f"{extra:11.2f} ms"
            cpu_extra = "" if run == "level 1" else f"{cpu - base_cpu:+7.2f} ms"
            print(f"{name:<9} {tasks:>6} {run:<15} {median:>7.2f}s {spread(values):>12} "
                  f"{ratio:>8.2f}x {extra_text:>15} {cpu:>14.2f} ms {cpu_extra:>9}")
    print()
    print(report)
    print()
    print(f"mock level-2 trace: {size} bytes, {size / mock_tasks:.0f} per task")
    print(f"memory counters: {counter_total} bytes for {counter_values} values, "
          f"{counter_total / max(1, counter_values):.1f} bytes per value")
    print(f"memory annotations per task: median {statistics.median(costs):.0f} bytes, "
          f"max {max(costs)} (target <= 200)")
    ok = True
    for name, target in (("trivial", TARGET_TRIVIAL_RATIO), ("mock", TARGET_MOCK_RATIO)):
        if name not in ratios:
            continue
        passed = ratios[name] <= target
        ok = ok and passed
        print(f"{'PASS' if passed else 'FAIL'}: {name} level 2 / level 1 = {ratios[name]:.2f}x "
              f"(target <= {target}x)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""What tracing costs the reference runner: wall time, trace size, level-0 calls.

Run by hand (it is not a test), from the project root:

    .venv/bin/python benchmarks/bench_runner.py                  # ~1-2 min on 2 cores
    .venv/bin/python benchmarks/bench_runner.py --tasks 500 --repeats 3 --levels 0,1
    .venv/bin/python benchmarks/bench_runner.py --task-ms 10 --tasks 500 --levels 0,1

It starts a local Ray (``--num-cpus``, default all cores) and runs
``tracer.runner.Pipeline`` on ``--tasks`` trivial tasks (one stage, a no-op
function) at each tracing level, the levels interleaved and rotated in every
repetition, and reports medians:

* wall time per level and its ratio to level 0 (target: level 1 <= 1.10x);
* trace bytes per task at level 1, the whole file (every track) divided by
  the number of tasks (target: <= 200 B), with a breakdown per event kind and
  per annotation;
* the cost of one tracer call at level 0 (``NullRunnerTracer``): timeit
  runs a small Python function making the call, and the same loop over an
  empty function is subtracted (``net``; target: <= 100 ns per call; a
  ``with`` block counts as one call, its ``__enter__``/``__exit__``
  included; a block's updater ``m(...)`` is a call of its own, and rows
  chaining several calls are shown, not checked), and for comparison the
  cost of the same calls at level 1 (a ``RunnerTracer`` writing to a file).

It prints PASS/FAIL per target and exits 1 when one fails.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
import timeit
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from cpu_meter import busy_load, load_pids, machine_busy_s, proc_cpu_s, tree_cpu_s

from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.format import TraceWriter
from tracer.ray import (
    NullRunnerTracer,
    ResourceRequest,
    RunnerTracer,
    TracingLevel,
    wait_for_traces,
)
from tracer.runner import Pipeline, Stage

TARGET_RATIO = 1.10
TARGET_CALL_NS = 100.0
TARGET_BYTES_PER_TASK = 200.0


def noop(x: int) -> int:
    return x


def busy(x: int, ms: float) -> int:
    """A task that computes for ``ms`` milliseconds (a CPU-bound UDF of that length)."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass
    return x


#: Milliseconds each task computes (--task-ms); 0: the no-op tasks of the targets.
TASK_MS = [0.0]


def task_stage() -> Stage:
    """The one stage of the benchmark's runs: no-op tasks, or tasks computing --task-ms
    (shared with bench_level1.py)."""
    if TASK_MS[0] > 0:
        return Stage("noop", functools.partial(busy, ms=TASK_MS[0]))
    return Stage("noop", noop)


# ------------------------------------------------------------------- runs


#: CPU seconds of one run, by where they were spent (see cpu_now).
CPU_KINDS = ("driver main thread", "driver process", "driver + Ray", "all processes")

def cpu_now() -> tuple[float, float, float, float]:
    """CPU seconds so far: this thread (the dispatch loop's), this process, this
    process and Ray's under it, the machine (less the --busy load's).

    Wall time on a small machine is noisy and follows the CPU of every
    process; these say where level 1's extra time is spent.
    """
    t = os.times()
    machine = machine_busy_s() - sum(proc_cpu_s(p) for p in load_pids())
    return time.thread_time(), t.user + t.system, tree_cpu_s(), machine


def run_once(level: int, tasks: int, trace_path: Path) -> tuple[float, int, tuple[float, ...]]:
    """Wall seconds of one run, its trace size (0 when untraced) and CPU seconds (CPU_KINDS).

    The wall time is until the run returned; the CPU and the size, until its
    trace was finished (Ray's last events are drawn after the run returned).
    """
    trace_path.unlink(missing_ok=True)
    pipeline = Pipeline(list(range(tasks)), [task_stage()])
    cpu_before = cpu_now()
    start = time.perf_counter()
    results = pipeline.run(tracing_level=level, trace_path=trace_path, progress=False)
    elapsed = time.perf_counter() - start
    wait_for_traces()
    cpu = tuple(b - a for a, b in zip(cpu_before, cpu_now(), strict=True))
    assert results == list(range(tasks))
    size = trace_path.stat().st_size if level else 0
    assert level or not trace_path.exists(), "level 0 wrote a trace"
    return elapsed, size, cpu


def bench_levels(
    levels: list[int], tasks: int, repeats: int, level2_repeats: int, folder: Path
) -> tuple[dict[int, list[float]], dict[int, list[int]], dict[int, list[tuple[float, ...]]]]:
    """Every level once per repetition, in an order rotated each time; medians are taken later.

    Level 2 (memray measuring every task; bench_memory.py measures what it costs)
    runs only in the first ``level2_repeats`` repetitions.
    """
    times: dict[int, list[float]] = defaultdict(list)
    sizes: dict[int, list[int]] = defaultdict(list)
    cpus: dict[int, list[tuple[float, ...]]] = defaultdict(list)
    for level in levels:  # warm-up: workers started, functions exported
        run_once(level, min(tasks, 200), folder / f"warmup-{level}.perfetto-trace")
    for rep in range(repeats):
        shift = rep % len(levels)
        order = levels[shift:] + levels[:shift]
        for level in order:
            if level >= 2 and rep >= level2_repeats:
                continue
            elapsed, size, cpu = run_once(level, tasks, folder / f"level{level}.perfetto-trace")
            times[level].append(elapsed)
            sizes[level].append(size)
            cpus[level].append(cpu)
            print(f"  rep {rep + 1}/{repeats} level {level}: {elapsed:.3f} s", flush=True)
    return times, sizes, cpus


# ------------------------------------------------------------ call costs


def _ns_per_call(stmt: Callable[[], Any], number: int) -> float:
    timer = timeit.Timer(stmt)
    best = min(timer.repeat(repeat=7, number=number))
    return best / number * 1e9


def call_costs(tracer: Any, number: int) -> dict[str, float]:
    """ns per call of the dispatch loop's tracer calls, each made by a function (best of 7)."""
    request = ResourceRequest(num_cpus=1)
    ids = (f"0-{i}" for i in range(10**9))

    def dispatching() -> None:
        with tracer.dispatching():
            pass

    def wave() -> None:
        with tracer.dispatch_wave(1):
            pass

    def awaiting() -> None:
        with tracer.awaiting(1, 0.1):
            pass

    with tracer.dispatch_wave(1) as update:  # the wave's updater, called on its own
        pass

    def wave_and_update() -> None:
        with tracer.dispatch_wave(1) as metrics:
            metrics(dispatched=1)

    def task_cycle() -> None:  # created, dispatched, received: the tracer's part of one task
        task_id = next(ids)
        tracer.task_created(task_id, 0, request, "noop", stage_name="noop")
        tracer.task_dispatched(task_id)
        tracer.task_received_as_ready(task_id)

    return {
        "count_inflight_tasks(n)": _ns_per_call(lambda: tracer.count_inflight_tasks(3), number),
        "mark_dispatch_task()": _ns_per_call(lambda: tracer.mark_dispatch_task(), number),
        "task_created(id, stage, req, ..)": _ns_per_call(
            lambda: tracer.task_created("0-1", 0, request, "noop", stage_name="noop"), number
        ) if isinstance(tracer, NullRunnerTracer) else float("nan"),
        "task_received_as_ready(id)": _ns_per_call(
            lambda: tracer.task_received_as_ready("0-1"), number
        ),
        "with dispatching()": _ns_per_call(dispatching, number),
        "with dispatch_wave(n)": _ns_per_call(wave, number),
        "with awaiting(n, timeout)": _ns_per_call(awaiting, number),
        "m(dispatched=1) (a block's updater)": _ns_per_call(lambda: update(dispatched=1), number),
        "with dispatch_wave(n) as m: m(..) (2 calls)": _ns_per_call(wave_and_update, number),
        "task created+dispatched+received": _ns_per_call(task_cycle, number),
        "(empty timeit loop)": _ns_per_call(lambda: None, number),
    }


def level1_call_costs(folder: Path, number: int) -> dict[str, float]:
    """The same calls on a RunnerTracer writing to a file (no Ray: no measurements to fetch)."""
    writer = TraceWriter(folder / "calls.perfetto-trace")
    tracer = RunnerTracer(
        writer, execution_id="calls", level=TracingLevel.TIMELINE, cluster_resources={"CPU": 2}
    )
    try:
        return call_costs(tracer, number)
    finally:
        tracer.close()


# ---------------------------------------------------------------- profile


def _instrument(cls: type, names: list[str], totals: dict[str, list[float]]) -> list[Any]:
    """Wrap ``cls``'s methods to add their wall time and calls to ``totals``; returns undo info."""
    undo = []
    for name in names:
        original = cls.__dict__.get(name)
        if not callable(original):
            continue
        key = f"{cls.__name__}.{name}"

        def timed(*args: Any, __f: Any = original, __k: str = key, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return __f(*args, **kwargs)
            finally:
                entry = totals[__k]
                entry[0] += time.perf_counter() - start
                entry[1] += 1

        setattr(cls, name, timed)
        undo.append((cls, name, original))
    return undo


def profile_run(level: int, tasks: int, folder: Path) -> tuple[float, dict[str, list[float]]]:
    """One run with the tracer's driver-side methods timed (inclusive wall time)."""
    from tracer.ray.wrappers import RayRunnableFunctionWrapper

    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    skip = {"dispatch_wave", "dispatch_batching", "dispatching", "awaiting",
            "get_next_physical_plan", "plan_polling", "_loop_slice", "disabled"}
    names = [
        n for n, v in vars(RunnerTracer).items()
        if callable(v) and not n.startswith("__") and n not in skip
    ]
    undo = _instrument(RunnerTracer, names, totals)
    undo += _instrument(RayRunnableFunctionWrapper, ["remote"], totals)
    undo += _instrument(TraceWriter, ["flush"], totals)
    try:
        elapsed, _, _ = run_once(level, tasks, folder / f"profile{level}.perfetto-trace")
    finally:
        for cls, name, original in undo:
            setattr(cls, name, original)
    return elapsed, totals


def worker_side_costs() -> dict[str, float]:
    """Inside a Ray worker: the cost of measuring one task (level 1), in us."""

    @ray.remote
    def probe() -> dict[str, float]:
        from tracer.ray.task_metrics import (
            TaskContext,
            _where,
            current_rss,
            measure_task,
            pack_metrics,
        )

        ctx = TaskContext("e", "0-1", 0, 1)

        def measured() -> None:
            with measure_task(ctx):
                pass

        n = 2000
        with measure_task(ctx) as metrics:
            pass
        return {
            "measure_task (whole)": _ns_per_call(measured, n) / 1000,
            "  where: node, Ray task id, resources": _ns_per_call(_where, n) / 1000,
            "  current_rss (/proc read)": _ns_per_call(current_rss, n) / 1000,
            "pack the metrics (pack_metrics)": _ns_per_call(lambda: pack_metrics(metrics), n)
            / 1000,
            "packed metrics size (bytes)": float(len(pack_metrics(metrics))),
        }

    return dict(ray.get(probe.remote()))


# --------------------------------------------------------- size breakdown


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _records(data: bytes) -> list[tuple[int, bytes]]:
    """(record size, packet bytes) of every ``Trace.packet`` record, inflating bundles."""
    out: list[tuple[int, bytes]] = []
    pos = 0
    while pos < len(data):
        start = pos
        assert data[pos] == 0x0A, f"bad framing at {pos}"
        length, pos = read_varint(data, pos + 1)
        body = data[pos: pos + length]
        pos += length
        packet = pb.TracePacket.FromString(body)
        if packet.HasField("compressed_packets"):
            import zlib

            inner = _records(zlib.decompress(packet.compressed_packets))
            scale = (pos - start) / max(1, sum(n for n, _ in inner))
            out.extend((round(n * scale), b) for n, b in inner)
        else:
            out.append((pos - start, body))
    return out


def size_breakdown(path: Path) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Bytes and events per event kind, and bytes per annotation name, in a level-1 trace."""
    data = path.read_bytes()
    groups: dict[int, str] = {}
    names: dict[int, str] = {}
    ann_names: dict[int, str] = {}
    by_kind: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    by_arg: dict[str, int] = defaultdict(int)
    for size, body in _records(data):
        packet = pb.TracePacket.FromString(body)
        interned = packet.interned_data
        for e in interned.event_names:
            names[e.iid] = e.name
        for e in interned.debug_annotation_names:
            ann_names[e.iid] = e.name
        if packet.HasField("interned_data"):
            by_kind["interned data (names, strings)"] += len(interned.SerializeToString()) + 3
            size -= len(interned.SerializeToString()) + 3
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            name = d.thread.thread_name or d.process.process_name or d.name
            group = (
                "counter" if d.HasField("counter") else
                "worker" if name.startswith("worker") else
                "node" if name.startswith("Node") else
                "loop" if d.HasField("thread") else
                "lane" if name == "tasks" else
                "stage" if ":" in name else name
            )
            groups[d.uuid] = group
            by_kind[f"track descriptors ({group})"] += size
            continue
        if not packet.HasField("track_event"):
            by_kind["setup (clock snapshot, defaults, ordering)"] += size
            continue
        ev = packet.track_event
        group = groups.get(ev.track_uuid, "?")
        kind = {1: "begin", 2: "end", 3: "instant", 4: "counter"}.get(ev.type, str(ev.type))
        if kind == "counter":
            key = "counter samples"
        elif kind == "end":
            key = f"end on {group}" + (" (+args)" if ev.debug_annotations else "")
        else:
            key = f"{kind} {names.get(ev.name_iid, ev.name)!r} on {group}"
        by_kind[key] += size
        counts[key] += 1
        for ann in ev.debug_annotations:
            by_arg[ann_names.get(ann.name_iid, ann.name)] += len(ann.SerializeToString()) + 2
        for _ in ev.flow_ids:
            by_arg["(flow ids)"] += 10
        for _ in ev.terminating_flow_ids:
            by_arg["(terminating flow ids)"] += 10
    return dict(by_kind), dict(counts), dict(by_arg)


# ------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--level2-repeats", type=int, default=1, help="repetitions that run level 2 (slow)"
    )
    parser.add_argument("--levels", default="0,1,2", help="comma-separated levels to run")
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--calls", type=int, default=200_000, help="timeit calls per repeat")
    parser.add_argument(
        "--task-ms", type=float, default=0.0,
        help="each task computes this long (ms) instead of doing nothing: what tracing costs "
        "real tasks (the wall-time target is for no-op tasks)",
    )
    parser.add_argument(
        "--ray-idle-kill", action="store_true",
        help="let Ray kill idle workers (its default): noisier runs, see main()",
    )
    parser.add_argument(
        "--busy", type=int, default=0,
        help="keep the cores busy: this many processes spinning during the level runs",
    )
    parser.add_argument(
        "--no-profile", action="store_true",
        help="skip the timed run that splits level 1's extra time by tracer method",
    )
    args = parser.parse_args()
    levels = sorted({int(x) for x in args.levels.split(",")})
    if args.task_ms < 0:
        parser.error("--task-ms must be >= 0")
    TASK_MS[0] = args.task_ms
    if 0 not in levels:
        parser.error("--levels must include 0 (the baseline)")
    os.environ.pop("TRACER_ENABLE_RAY_TRACING", None)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    n = args.tasks

    results: list[tuple[str, bool, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench_runner.") as tmp:
        folder = Path(tmp)
        print(f"tracer calls in the driver (ns per call, best of 7 x {args.calls} calls):")
        null_costs = call_costs(NullRunnerTracer(), args.calls)
        l1_costs = level1_call_costs(folder, args.calls // 10)
        # Every row times a Python function making the call(s), so the
        # empty loop's row (a function doing nothing) is what a row costs
        # without the call: "net" is the call's own cost.
        empty = null_costs["(empty timeit loop)"]
        print(f"  {'call':<44} {'level 0':>9} {'net':>7} {'level 1':>9}")
        for name, ns in null_costs.items():
            l1 = l1_costs.get(name, float("nan"))
            l1_text = f"{l1:7.0f}ns" if l1 == l1 else "        -"
            net = f"{ns - empty:5.0f}ns" if not name.startswith("(") else ""
            print(f"  {name:<44} {ns:7.0f}ns {net:>7} {l1_text}")
        # Each row is one call (a with-block: the method, then __enter__ and
        # __exit__); rows that chain several calls are shown, not checked.
        worst_name, worst = max(
            (
                (k, v - empty) for k, v in null_costs.items()
                if not k.startswith("(") and "+" not in k and "calls)" not in k
            ),
            key=lambda kv: kv[1],
        )
        results.append(
            ("level-0 tracer call", worst <= TARGET_CALL_NS,
             f"worst {worst:.0f} ns/call net of the timing loop ({empty:.0f} ns), "
             f"{worst_name} (target <= {TARGET_CALL_NS:.0f} ns)")
        )

        # Ray kills workers idle for 1 s beyond its soft limit (the CPU count)
        # and starts new ones when tasks queue again: a worker's start costs
        # ~0.25 s of CPU, which lands in whichever run it happens in, at any
        # level (+5-15% on a run, measured). Idle workers are kept alive
        # here, so runs compare the tracer, not Ray's worker churn;
        # --ray-idle-kill restores Ray's default.
        system_config = {} if args.ray_idle_kill else {
            "idle_worker_killing_time_threshold_ms": 10**9
        }
        ray.init(
            num_cpus=args.num_cpus,
            object_store_memory=200 * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=False,
            _system_config=system_config,
        )
        try:
            what = f"{args.task_ms:g} ms tasks" if args.task_ms else "no-op tasks"
            print(
                f"\npipeline: {n} {what} in one stage, levels {levels}, "
                f"{args.repeats} repeats (level 2: {args.level2_repeats}), {args.num_cpus} CPUs, "
                f"busy load: {args.busy} spinning process(es)"
            )
            with busy_load(args.busy):
                times, sizes, cpus = bench_levels(
                    levels, n, args.repeats, args.level2_repeats, folder
                )
            base = statistics.median(times[0])
            print(
                f"\n  {'level':<6} {'median':>9} {'min':>9} {'max':>9} {'ratio':>7} "
                f"{'per task':>9} {'extra/task':>11}"
            )
            for level in levels:
                med = statistics.median(times[level])
                print(
                    f"  {level:<6} {med:8.3f}s {min(times[level]):8.3f}s "
                    f"{max(times[level]):8.3f}s {med / base:6.3f}x {med / n * 1e6:7.0f}us "
                    f"{(med - base) / n * 1e6:9.0f}us"
                )
            print("\n  CPU per task, medians (extra over level 0 in brackets):")
            print(f"  {'level':<6}" + "".join(f" {kind:>26}" for kind in CPU_KINDS))
            base_cpu = [statistics.median(c[i] for c in cpus[0]) for i in range(len(CPU_KINDS))]
            for level in levels:
                cells = []
                for i in range(len(CPU_KINDS)):
                    med = statistics.median(c[i] for c in cpus[level]) / n * 1e6
                    extra = med - base_cpu[i] / n * 1e6
                    cells.append(f"{med:8.0f}us ({extra:+6.0f}us)")
                print(f"  {level:<6}" + "".join(f" {cell:>26}" for cell in cells))
            if 1 in levels and not args.no_profile:
                print("\nwhere level 1's time goes (one timed run per level; inclusive wall time):")
                t0, p0 = profile_run(0, n, folder)
                t1, p1 = profile_run(1, n, folder)
                print(
                    f"  run: level 0 {t0 / n * 1e6:.0f} us/task, "
                    f"level 1 {t1 / n * 1e6:.0f} us/task"
                )
                print(f"  {'driver-side method':<50} {'calls':>7} {'us/call':>8} {'us/task':>8}")
                for key, (secs, calls) in sorted(p1.items(), key=lambda kv: -kv[1][0]):
                    if secs > t1 / 2 and calls <= 2:
                        print(f"  {key:<50} (a background loop, not on the dispatch path)")
                    elif secs / n * 1e6 >= 0.5:
                        print(
                            f"  {key:<50} {calls:7d} {secs / calls * 1e6:8.1f} "
                            f"{secs / n * 1e6:8.1f}"
                        )
                submit0 = p0.get("RayRunnableFunctionWrapper.remote", [0.0, 1])
                submit1 = p1.get("RayRunnableFunctionWrapper.remote", [0.0, 1])
                print(
                    "  task submission (RayRunnableFunctionWrapper.remote): "
                    f"level 0 {submit0[0] / n * 1e6:.0f} us/task, "
                    f"level 1 {submit1[0] / n * 1e6:.0f} us/task"
                )
                print("  in the worker, per task at level 1 (us):")
                for key, value in worker_side_costs().items():
                    print(f"    {key:<40} {value:8.1f}")
        finally:
            ray.shutdown()

        if 1 in levels:
            ratio = statistics.median(times[1]) / base
            results.append(
                ("level 1 wall time" + (f" ({args.task_ms:g} ms tasks)" if args.task_ms else ""),
                 ratio <= TARGET_RATIO,
                 f"{ratio:.3f}x level 0 (target <= {TARGET_RATIO:.2f}x)")
            )
            size = statistics.median(sizes[1])
            per_task = size / n
            results.append(
                ("level 1 trace size", per_task <= TARGET_BYTES_PER_TASK,
                 f"{per_task:.0f} B/task, {size / 1e6:.2f} MB for {n} tasks "
                 f"(target <= {TARGET_BYTES_PER_TASK:.0f} B/task)")
            )
            by_kind, counts, by_arg = size_breakdown(folder / "level1.perfetto-trace")
            total = sum(by_kind.values())
            print(f"\nlevel-1 trace, per task, by event kind ({total} B in all):")
            print(f"  {'B/task':>7} {'events/task':>11} {'B/event':>8}  kind")
            for key, b in sorted(by_kind.items(), key=lambda kv: -kv[1]):
                if b / n < 0.5:
                    continue
                c = counts.get(key)
                detail = f"{c / n:11.2f} {b / c:8.1f}" if c else f"{'':11} {'':8}"
                print(f"  {b / n:7.1f} {detail}  {key}")
            print("annotations (and flow ids) inside those events, per task:")
            for key, b in sorted(by_arg.items(), key=lambda kv: -kv[1]):
                if b / n >= 0.5:
                    print(f"  {b / n:7.1f}  {key}")
    print()
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())

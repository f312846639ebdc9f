"""Where level 1's cost is: executions from Ray's events against the return channel.

Run by hand (it is not a test), from the project root:

    .venv/bin/python benchmarks/bench_level1.py                       # quiet machine
    .venv/bin/python benchmarks/bench_level1.py --busy 2              # both cores kept busy
    .venv/bin/python benchmarks/bench_level1.py --task-ms 10 --tasks 1000   # tasks that compute

Variants of one run of ``tracer.runner.Pipeline`` on ``--tasks`` no-op tasks (or tasks
computing for ``--task-ms`` each),
interleaved and rotated in every repetition (medians, min and max):

* ``0``       untraced;
* ``1``       level 1 as shipped (the default, ``TRACER_EXECUTIONS=returns``):
  each task's extra return value with its measurements, and Ray's events
  read in the background for the phases;
* ``1-events`` level 1 with executions from Ray's events
  (``TRACER_EXECUTIONS=ray_events``): node, worker, start and end from
  them, the RSS from a profile event of the task's; no extra return value;
* ``1-noev``  the return channel without reading Ray's events
  (``TRACER_RAY_EVENTS=0``, which is also what level 1 falls back to when
  Ray's events cannot be read);
* ``1-plain`` level 1 with tasks submitted as they are, nothing measured in
  the worker and no executions (the timeline of the loop and the task
  slices only): the floor of any level 1.

Per variant: wall time, and CPU per task in the driver, in the driver and
every process under it (Ray's GCS, raylet and workers: the run's CPU across
all its processes, which other users of a shared machine do not move), and
on the whole machine (/proc/stat, less what the ``--busy`` load processes
used; on a shared machine it has other users' work in it). These are
counted until the run's trace was finished, ~1 s after the run returned at
level 1 (Ray's workers report their last events once a second), so they hold
what Ray's idle processes spend meanwhile; the paired ratios also give the
CPU of the driver and Ray's processes until the run returned, without that
fixed wait (and without the last events' drawing). Then where the run's CPU
went: the driver's dispatch-loop thread, its other threads (Ray's and the
tracer's), the workers, the raylet and the GCS; and of the driver's, what
its cycle collector took (in whichever thread set it off) and how many full
collections it ran.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runner import TASK_MS, task_stage
from cpu_meter import KINDS, busy_load, machine_busy_s, proc_cpu_s, tree_cpu_by_kind, tree_cpu_s

from tracer.ray import wait_for_traces
from tracer.runner import Pipeline

VARIANTS = ("0", "1", "1-events", "1-noev", "1-plain")


@contextlib.contextmanager
def variant(name: str) -> Iterator[int]:
    """Set up a variant; yields its tracing level."""
    if name == "0":
        yield 0
        return
    saved = {k: os.environ.get(k) for k in ("TRACER_RAY_EVENTS", "TRACER_EXECUTIONS")}
    if name == "1-noev":
        os.environ["TRACER_RAY_EVENTS"] = "0"
    os.environ["TRACER_EXECUTIONS"] = "ray_events" if name == "1-events" else "returns"
    undo = None
    if name == "1-plain":
        from tracer.ray import wrappers

        undo = wrappers._traced_call
        wrappers._traced_call = lambda f, options, ctx: None  # type: ignore[assignment]
    try:
        yield 1
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if undo is not None:
            from tracer.ray import wrappers

            wrappers._traced_call = undo


#: What one run measured: wall seconds until the run returned; CPU seconds of the
#: driver, of the driver and Ray's processes under it, and of the machine less the
#: load's, until its trace was finished (Ray's last events are drawn after the run
#: returned: their cost, and what Ray's idle processes spend meanwhile, are in);
#: seconds until the trace was finished; the CPU seconds under the driver by kind
#: (``cpu_meter.KINDS``); the CPU seconds of the driver and Ray's processes until the
#: run returned (without the wait for Ray's last events, a fixed ~1 s of Ray idling
#: that is not per task).
Measured = tuple[float, float, float, float, float, dict[str, float], float]


#: Rows of the by-process table that are the driver's cycle collector: its CPU in every
#: thread of the driver (already counted in the driver's rows), and its full collections
#: (a count per run, not seconds), each walking the driver's whole heap.
GC_KINDS = ("driver: cycle collector", "driver: full collections")


@contextlib.contextmanager
def cycle_collector(kinds: dict[str, float]) -> Iterator[None]:
    """Times the cycle collector's collections in every thread (thread CPU) into ``kinds``."""
    started: dict[int, float] = {}
    kinds.update(dict.fromkeys(GC_KINDS, 0.0))

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[threading.get_ident()] = time.thread_time()
            return
        begun = started.pop(threading.get_ident(), None)
        if begun is not None:
            kinds[GC_KINDS[0]] += time.thread_time() - begun
        if info["generation"] == 2:
            kinds[GC_KINDS[1]] += 1

    gc.callbacks.append(timed)
    try:
        yield
    finally:
        gc.callbacks.remove(timed)


def run_once(name: str, tasks: int, path: Path, load: list[int]) -> Measured:
    """One run of the variant (see :data:`Measured`)."""
    path.unlink(missing_ok=True)
    pipeline = Pipeline(list(range(tasks)), [task_stage()])
    collector: dict[str, float] = {}
    with variant(name) as level, cycle_collector(collector):
        t = os.times()
        driver0 = t.user + t.system
        tree0 = tree_cpu_s()
        kinds0 = tree_cpu_by_kind()
        all0 = machine_busy_s() - sum(proc_cpu_s(p) for p in load)
        start = time.perf_counter()
        results = pipeline.run(tracing_level=level, trace_path=path, progress=False)
        wall = time.perf_counter() - start
        returned = tree_cpu_s() - tree0
        wait_for_traces()
        finished = time.perf_counter() - start
        t = os.times()
        driver = t.user + t.system - driver0
        tree = tree_cpu_s() - tree0
        kinds = {k: v - kinds0[k] for k, v in tree_cpu_by_kind().items()}
        kinds.update(collector)
        every = machine_busy_s() - sum(proc_cpu_s(p) for p in load) - all0
    assert results == list(range(tasks))
    return wall, driver, tree, every, finished, kinds, returned


def _init_ray() -> None:
    ray.init(
        num_cpus=os.cpu_count() or 2, object_store_memory=200 * 1024 * 1024,
        include_dashboard=False, log_to_driver=False,
        _system_config={"idle_worker_killing_time_threshold_ms": 10**9},
    )


def child(name: str, tasks: int, load: list[int]) -> int:
    """--fresh: one warm-up and one measured run in this process's own Ray; prints JSON."""
    _init_ray()
    try:
        with tempfile.TemporaryDirectory(prefix="bench_level1.") as tmp:
            folder = Path(tmp)
            run_once(name, min(tasks, 200), folder / "warmup.perfetto-trace", load)
            print(json.dumps(run_once(name, tasks, folder / "run.perfetto-trace", load)))
    finally:
        ray.shutdown()
    return 0


def run_child(name: str, tasks: int, load: list[int]) -> Measured:
    out = subprocess.run(
        [sys.executable, __file__, "--child", name, "--tasks", str(tasks),
         "--task-ms", str(TASK_MS[0]), "--load-pids", ",".join(map(str, load))],
        check=True, capture_output=True, text=True,
    ).stdout
    wall, driver, tree, every, finished, kinds, returned = json.loads(
        out.strip().splitlines()[-1]
    )
    return wall, driver, tree, every, finished, kinds, returned


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--busy", type=int, default=0, help="background processes spinning")
    parser.add_argument(
        "--task-ms", type=float, default=0.0,
        help="milliseconds each task computes (0: the no-op tasks of issue 21's target)",
    )
    parser.add_argument(
        "--fresh", action="store_true",
        help="each run in a new process with its own Ray (its own job: Ray's events of "
        "earlier runs are not in what level 1 reads)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--load-pids", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.task_ms < 0:
        parser.error("--task-ms must be >= 0")
    TASK_MS[0] = args.task_ms
    if args.child is not None:
        return child(args.child, args.tasks, [int(p) for p in args.load_pids.split(",") if p])
    names = args.variants.split(",")
    if names[0] != "0" or any(n not in VARIANTS for n in names):
        parser.error(f"--variants: from {VARIANTS}, starting with 0")
    os.environ.pop("TRACER_ENABLE_RAY_TRACING", None)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    n = args.tasks
    if not args.fresh:
        _init_ray()
    walls: dict[str, list[float]] = defaultdict(list)
    drivers: dict[str, list[float]] = defaultdict(list)
    trees: dict[str, list[float]] = defaultdict(list)
    alls: dict[str, list[float]] = defaultdict(list)
    finishes: dict[str, list[float]] = defaultdict(list)
    returns: dict[str, list[float]] = defaultdict(list)
    by_kind: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    try:
        with tempfile.TemporaryDirectory(prefix="bench_level1.") as tmp, \
                busy_load(args.busy) as load:
            folder = Path(tmp)
            for name in [] if args.fresh else names:  # warm-up
                run_once(name, min(n, 200), folder / "warmup.perfetto-trace", load)
            for rep in range(args.repeats):
                order = names[rep % len(names):] + names[: rep % len(names)]
                for name in order:
                    if args.fresh:
                        measured = run_child(name, n, load)
                    else:
                        measured = run_once(name, n, folder / f"{name}.perfetto-trace", load)
                    wall, driver, tree, every, finished, kinds, returned = measured
                    returns[name].append(returned)
                    for kind, cpu in kinds.items():
                        by_kind[name][kind].append(cpu)
                    walls[name].append(wall)
                    drivers[name].append(driver)
                    trees[name].append(tree)
                    alls[name].append(every)
                    finishes[name].append(finished)
                    print(f"  rep {rep + 1}/{args.repeats} {name:<12} {wall:.3f} s", flush=True)
    finally:
        if ray.is_initialized():
            ray.shutdown()

    def paired(series: dict[str, list[float]], name: str) -> str:
        """Median [quartiles] of the variant's ratio to level 0 within each repetition.

        The runs of one repetition follow each other within seconds, while the
        machine's speed drifts by ~10% over minutes: ratios of neighbours
        cancel most of that drift, which the ratio of medians keeps.
        """
        ratios = sorted(v / b for v, b in zip(series[name], series["0"], strict=True))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        return f"{statistics.median(ratios):.3f} [{q[0]:.3f}-{q[2]:.3f}]"

    def per_task_us(values: list[float]) -> str:
        med = statistics.median(values) / n * 1e6
        return f"{med:6.0f} [{min(values) / n * 1e6:5.0f}-{max(values) / n * 1e6:5.0f}]"

    base_wall = statistics.median(walls["0"])
    base_tree = statistics.median(trees["0"])
    base_all = statistics.median(alls["0"])
    what = f"{args.task_ms:g} ms tasks" if args.task_ms else "no-op tasks"
    print(f"\n{n} {what}, {args.repeats} repeats, busy load: {args.busy} process(es)"
          + (", each run in a fresh process" if args.fresh else ""))
    print(f"  {'variant':<12} {'wall med [min-max]':>24} {'ratio':>6} "
          f"{'driver CPU us/task':>22} {'driver+Ray CPU us/task':>23} {'vs 0':>7} "
          f"{'machine CPU us/task':>22} {'vs 0':>7} {'trace done':>10}")
    for name in names:
        med = statistics.median(walls[name])
        tree_med = statistics.median(trees[name])
        all_med = statistics.median(alls[name])
        print(
            f"  {name:<12} {med:7.3f}s [{min(walls[name]):.3f}-{max(walls[name]):.3f}] "
            f"{med / base_wall:5.3f}x {per_task_us(drivers[name]):>22} "
            f"{per_task_us(trees[name]):>23} {(tree_med / base_tree - 1) * 100:+6.1f}% "
            f"{per_task_us(alls[name]):>22} {(all_med / base_all - 1) * 100:+6.1f}% "
            f"{statistics.median(finishes[name]):9.3f}s"
        )
    print("\n  paired with the level-0 run of the same repetition, median [quartiles]:")
    print(f"  {'variant':<12} {'wall ratio':>22} {'driver+Ray CPU ratio':>22} "
          f"{'... until it returned':>22}")
    for name in names[1:]:
        print(f"  {name:<12} {paired(walls, name):>22} {paired(trees, name):>22} "
              f"{paired(returns, name):>22}")
    print("\n  driver + Ray CPU by process (thread), us/task, median (and over level 0):")
    print(f"  {'':<22}" + "".join(f"{name:>16}" for name in names))
    for kind in (*KINDS, GC_KINDS[0]):
        base = statistics.median(by_kind["0"][kind]) / n * 1e6
        cells = []
        for name in names:
            med = statistics.median(by_kind[name][kind]) / n * 1e6
            cells.append(f"{med:6.0f}" + (f" ({med - base:+5.0f})" if name != "0" else " " * 8))
        print(f"  {kind:<22}" + "".join(f"{c:>16}" for c in cells))
    print(f"  {GC_KINDS[1] + ', a run':<22}" + "".join(
        f"{statistics.median(by_kind[name][GC_KINDS[1]]):>16g}" for name in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())

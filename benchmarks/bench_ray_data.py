"""What tracing costs a Ray Data pipeline: wall time per level, trace bytes per task.

Run by hand (it is not a test), from the project root:

    .venv/bin/python benchmarks/bench_ray_data.py                    # 2000 tasks, ~10-15 min
    .venv/bin/python benchmarks/bench_ray_data.py --tasks 500 --repeats 2 --levels none,0,1
    .venv/bin/python benchmarks/bench_ray_data.py --shuffle --tasks 200 --levels none,1
    .venv/bin/python benchmarks/bench_ray_data.py --tasks 1000 --levels none,1,1-noev

It starts a local Ray (``--num-cpus``, default 2) and runs
``ray.data.range(T, override_num_blocks=T).map_batches(noop).materialize()``
(T tasks of one fused operator) under each setting, interleaved and rotated
in every repetition after one untimed warm-up; with ``--shuffle``,
``...map_batches(noop).random_shuffle().materialize()``: an all-to-all
operator with the map fused into it, T map and T reduce tasks, traced from
the driver (:mod:`tracer.integrations.ray_data.all_to_all`):

* ``none``: nothing registered (plain Ray Data);
* ``0``: ``RAY_DATA_EXECUTION_CALLBACKS`` names the callback, the level is unset
  (what "switched off" costs);
* ``1`` / ``2``: ``tracer.integrations.ray_data.enable(level=...)``;
* ``1-noev``: level 1 without Ray's own events (``TRACER_RAY_EVENTS=0``).

It reports the median wall time per setting with its spread (min-max), the
ratio of each median to ``none``'s, each run's ratio to the first setting's
run of the same repetition (median), the CPU per task of the driver and
Ray's processes under it (until the trace was finished: the tracer's
background work included), and the level-1 traces' bytes per task
(targets: level 1 <= 1.05x, level 0 no measurable difference, <= 200 B per
task). The machine's other load shows in the spread: read the ratios with it.

The job's metrics actor is started by the warm-up and kept: between runs
tracing is switched off by taking :func:`~tracer.integrations.ray_data.enable`'s
settings out of the ``DataContext``, not by ``disable()``, which removes it.

A traced execution's trace is finished in the background once it returned
(Ray's last events come a second late, :mod:`tracer.ray.finishing`): the
timed run ends when ``materialize()`` returns, as the user's program goes on
then, and the next run starts once the trace is finished (untimed), so that
runs do not overlap.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import ray.data
from cpu_meter import tree_cpu_s

import tracer.integrations.ray_data as traced_data
from tracer.integrations.ray_data import _compat
from tracer.ray import wait_for_traces

CALLBACK = "tracer.integrations.ray_data.TracingCallback"
TARGET_RATIO = 1.05
TARGET_BYTES_PER_TASK = 200.0


def noop(batch: dict[str, Any]) -> dict[str, Any]:
    return batch


def run(
    tasks: int, setting: str, folder: Path, shuffle: bool = False
) -> tuple[float, float, Path | None]:
    """One run: its wall time, the CPU seconds of the driver and Ray's processes until its
    trace was finished, and its trace."""
    os.environ.pop("RAY_DATA_EXECUTION_CALLBACKS", None)
    os.environ.pop("TRACER_ENABLE_RAY_TRACING", None)
    os.environ.pop("TRACER_RAY_EVENTS", None)
    # Off for this run, the job's metrics actor kept (disable() would remove it: each
    # level-1 run then paid the start of its process, ~1.5-2 s of CPU, as only a
    # program's first traced pipeline does).
    ctx = ray.data.DataContext.get_current()
    with contextlib.suppress(KeyError):
        ctx.remove_config(traced_data.CONFIG_KEY)
    _compat.unregister_callback(ctx, traced_data.TracingCallback)
    if setting == "0":
        os.environ["RAY_DATA_EXECUTION_CALLBACKS"] = CALLBACK
    elif setting in ("1", "2"):
        traced_data.enable(level=int(setting), path=folder)
    elif setting == "1-noev":
        os.environ["TRACER_RAY_EVENTS"] = "0"
        traced_data.enable(level=1, path=folder)
    before = len(traced_data.trace_paths())
    cpu0 = tree_cpu_s()
    start = time.perf_counter()
    ds = ray.data.range(tasks, override_num_blocks=tasks).map_batches(noop)
    (ds.random_shuffle() if shuffle else ds).materialize()
    elapsed = time.perf_counter() - start
    wait_for_traces()
    cpu = tree_cpu_s() - cpu0
    paths = traced_data.trace_paths()
    return elapsed, cpu, paths[-1] if len(paths) > before else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--levels", default="none,0,1,2")
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--shuffle", action="store_true",
                        help="a random shuffle with the map fused into it (2 tasks a block)")
    args = parser.parse_args()
    settings = [s.strip() for s in args.levels.split(",") if s.strip()]
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    folder = Path(tempfile.mkdtemp(prefix="bench-ray-data-"))
    tasks_run = args.tasks * (2 if args.shuffle else 1)
    # warm-up: workers, the metrics actor, imports
    run(min(args.tasks, 200), "1", folder, args.shuffle)
    times: dict[str, list[float]] = {s: [] for s in settings}
    cpus: dict[str, list[float]] = {s: [] for s in settings}
    sizes: dict[str, list[float]] = {s: [] for s in settings}
    for rep in range(args.repeats):
        order = settings[rep % len(settings):] + settings[: rep % len(settings)]
        for setting in order:
            elapsed, cpu, path = run(args.tasks, setting, folder, args.shuffle)
            times[setting].append(elapsed)
            cpus[setting].append(cpu)
            if setting.startswith("1") and path is not None:
                sizes[setting].append(path.stat().st_size / tasks_run)
            print(f"  rep {rep} level {setting:>6}: {elapsed:6.2f} s, CPU {cpu:6.2f} s",
                  flush=True)
    base = statistics.median(times[settings[0]])
    print(f"\n{tasks_run} tasks{' (random shuffle)' if args.shuffle else ''}, "
          f"{args.repeats} repetitions, {args.num_cpus} CPUs "
          f"(medians; spread = min-max; ratio to '{settings[0]}')")
    failed = False
    for setting in settings:
        values = times[setting]
        med = statistics.median(values)
        ratio = med / base
        target = ""
        if setting == "1":
            ok = ratio <= TARGET_RATIO
            failed |= not ok
            target = f"  target <= {TARGET_RATIO:.2f}x: {'PASS' if ok else 'FAIL'}"
        paired = statistics.median(v / b for v, b in zip(values, times[settings[0]], strict=True))
        cpu_task = statistics.median(cpus[setting]) / tasks_run * 1e6
        cpu_paired = statistics.median(
            v / b for v, b in zip(cpus[setting], cpus[settings[0]], strict=True))
        print(f"  level {setting:>6}: {med:7.2f} s  ({min(values):.2f}-{max(values):.2f})  "
              f"{ratio:5.3f}x, paired {paired:5.3f}x; CPU {cpu_task:5.0f} us a task, "
              f"paired {cpu_paired:5.3f}x{target}")
    for setting, values in sizes.items():
        if not values:
            continue
        per_task = statistics.median(values)
        ok = per_task <= TARGET_BYTES_PER_TASK
        failed |= not ok
        print(f"  level {setting} trace: {per_task:.0f} B per task "
              f"(target <= {TARGET_BYTES_PER_TASK:.0f}: {'PASS' if ok else 'FAIL'})")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()

"""Scale: 20k tasks through the reference runner; the driver's memory stays bounded.

Run by hand (it is not a test), from the project root:

    .venv/bin/python benchmarks/bench_scale.py                 # 20k tasks, levels 0 and 1, ~3 min
    .venv/bin/python benchmarks/bench_scale.py --tasks 5000    # a quick look

Each level runs in a child process of its own (a fresh driver, so peak RSS
is that run's) with its own local Ray: ``tracer.runner.Pipeline`` over
``--tasks`` trivial tasks in ``--stages`` map stages. While it runs, a
thread samples every ``--interval`` seconds:

* the driver's RSS (``/proc/self/statm``);
* at level 1, the tracer's per-task structures: tasks in flight
  (``tracer._tasks``), received tasks waiting for their batch
  (``_received``), measurements pending (the return channel's), lanes (free
  ones and all task lanes created), per-stage lists (memory requests and
  peaks: the per-task index kept until a stage's slice is written),
  executions whose Ray events are still wanted, and the writer's tables
  (interned names and strings, encoded argument cache, cached event bodies,
  buffered bytes).

It prints the samples, the RSS growth per task over the second half of the
run (the first half includes Ray's own warm-up) at each level, and the peak
RSS at level 0 vs level 1. The parent then reads the level-1 trace with
``read_trace`` and checks it is complete: one task slice and one execution
per task, no problem, every slice closed. It exits 1 if the check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1 << 20


def rss() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def noop(x: int) -> int:
    return x


# ------------------------------------------------------------------ child: one run


def tracer_sizes(tracer: Any) -> dict[str, int]:
    """Sizes of the tracer's structures that could grow with the run (read from another
    thread: len() is atomic; a dict changing size while summed is retried next sample).
    These are private attributes: one that was renamed reads -1 rather than stopping
    the sampling (which stopped once at a rename, leaving the RSS growth unmeasured)."""
    writer = tracer.writer
    timeline = tracer._timeline
    stages = list(timeline.stages.by_id.values())
    probes: dict[str, Callable[[], int]] = {
        "created": lambda: sum(s.tasks for s in stages),
        "in_flight": lambda: len(tracer._tasks),
        "received": lambda: len(tracer._received),
        "pending_metrics": lambda: len(tracer._returns.pending),
        "free_lanes": lambda: len(timeline._free_lanes),
        "lanes": lambda: sum(
            1 for track in list(writer._tracks) if getattr(track, "name", None) == "tasks"
        ),
        "stage_index": lambda: sum(len(s.requests) + len(s.peaks) for s in stages),
        "ray_events_wanted": lambda: timeline._ray.missing + len(timeline._awaited),
        "failures_seen": lambda: len(tracer._failures._seen),
        "writer_tracks": lambda: len(writer._tracks),
        "interned": lambda: (
            len(writer._names) + len(writer._arg_names) + len(writer._string_values)
        ),
        "arg_cache": lambda: len(writer._arg_cache),
        "body_cache": lambda: sum(writer._cache_sizes.values()),
        "buffer_bytes": lambda: len(writer._buf),
    }
    sizes = {}
    for name, probe in probes.items():
        try:
            sizes[name] = probe()
        except RuntimeError:
            raise  # a dict that changed size meanwhile: this sample is skipped
        except Exception:
            sizes[name] = -1
    return sizes


def child(level: int, tasks: int, stages: int, interval: float, trace: Path) -> None:
    import ray

    import tracer.runner.pipeline as pipeline_module
    from tracer.ray import wait_for_traces
    from tracer.runner import Pipeline, Stage

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * MIB)
    current: dict[str, Any] = {}
    original = pipeline_module.ray_tracer

    @contextlib.contextmanager
    def capturing(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with original(*args, **kwargs) as tracer:
            current["tracer"] = tracer
            yield tracer

    pipeline_module.ray_tracer = capturing  # type: ignore[assignment]
    # Warm up Ray (workers started, the function exported) outside the measured run.
    Pipeline(list(range(50)), [Stage("warmup", noop)]).run(tracing_level=0, progress=False)

    samples: list[dict[str, Any]] = []
    done = threading.Event()
    start = time.monotonic()

    def sample() -> None:
        while not done.wait(interval):
            row: dict[str, Any] = {"t": round(time.monotonic() - start, 2), "rss": rss()}
            tracer = current.get("tracer")
            if tracer is not None and getattr(tracer, "enabled", False):
                with contextlib.suppress(RuntimeError):
                    row.update(tracer_sizes(tracer))
            samples.append(row)

    thread = threading.Thread(target=sample, daemon=True)
    rss_before = rss()
    thread.start()
    per_stage = tasks // stages
    pipeline = Pipeline(
        list(range(per_stage)), [Stage(f"s{i}", noop) for i in range(stages)]
    )
    results = pipeline.run(tracing_level=level, trace_path=trace, progress=False)
    elapsed = time.monotonic() - start
    wait_for_traces()  # Ray's last events, drawn after the run returned
    done.set()
    thread.join()
    assert results == list(range(per_stage))
    print(json.dumps({
        "level": level,
        "tasks": per_stage * stages,
        "seconds": elapsed,
        "rss_before": rss_before,
        "rss_after": rss(),
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "samples": samples,
        "trace_bytes": trace.stat().st_size if level else 0,
    }))
    ray.shutdown()


# ---------------------------------------------------------------- parent: report


def run_child(level: int, args: argparse.Namespace, trace: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(level), "--tasks", str(args.tasks),
         "--stages", str(args.stages), "--interval", str(args.interval), "--trace", str(trace)],
        capture_output=True, text=True, check=False,
        env={**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")},
    )
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"the level-{level} run failed (exit {out.returncode})")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def growth_per_task(result: dict[str, Any]) -> float:
    """RSS growth per task created over the second half of the run (level 1 counts tasks
    from the tracer; level 0 assumes a steady rate over time)."""
    samples = result["samples"]
    if len(samples) < 4:
        return float("nan")
    half = samples[len(samples) // 2:]
    first, last = half[0], half[-1]
    if "created" in first:
        tasks = last["created"] - first["created"]
    else:
        tasks = result["tasks"] * (last["t"] - first["t"]) / result["seconds"]
    return (last["rss"] - first["rss"]) / tasks if tasks else float("nan")


def print_samples(result: dict[str, Any], rows: int = 12) -> None:
    samples = result["samples"]
    if not samples:
        return
    step = max(1, len(samples) // rows)
    picked = samples[::step]
    if picked[-1] is not samples[-1]:
        picked.append(samples[-1])
    keys = [k for k in samples[-1] if k not in ("t", "rss")]
    head = f"{'t (s)':>7} {'RSS MiB':>8} " + " ".join(f"{k:>15}" for k in keys)
    print(head)
    for row in picked:
        cells = " ".join(f"{row.get(k, ''):>15}" for k in keys)
        print(f"{row['t']:>7} {row['rss'] / MIB:>8.1f} {cells}")
    if keys:
        maxima = {k: max(r.get(k, 0) for r in samples) for k in keys}
        print("max     " + " " * 9 + " ".join(f"{maxima[k]:>15}" for k in keys))


def check_trace(path: Path, tasks: int) -> bool:
    from tracer.format import read_trace
    from tracer.ray import layout as L

    start = time.monotonic()
    model = read_trace(path)
    seconds = time.monotonic() - start
    task_slices = [s for s in model.slices if s.category == L.CAT_TASK and s.depth == 0]
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    open_slices = [s for s in model.slices if s.dur is None]
    ids = {s.args.get(L.ARG_TASK_ID) for s in task_slices}
    # Ray's phases (issue 21's target: present for >= 99% of the tasks).
    with_phases = {
        s.args.get(L.ARG_TASK_ID) for s in model.slices
        if s.category == L.CAT_RAY and s.name is not None
        and s.name.startswith(L.RAY_TASK_PREFIX) and s.dur is not None
    }
    phases_share = len(with_phases & ids) / max(len(ids), 1)
    ok = (
        len(task_slices) == tasks and len(ids) == tasks and len(executions) == tasks
        and not model.problems and not open_slices and not model.truncated
    )
    print(f"trace: {path.stat().st_size / MIB:.1f} MiB, read in {seconds:.1f} s: "
          f"{len(task_slices)} task slices ({len(ids)} ids), {len(executions)} executions, "
          f"{len(model.flows)} flows, {len(open_slices)} open slices, "
          f"{len(model.problems)} problems -> {'complete' if ok else 'INCOMPLETE'}")
    print(f"Ray's phases for {len(with_phases & ids)} of {len(ids)} tasks "
          f"({phases_share:.2%}; target >= 99%: {'PASS' if phases_share >= 0.99 else 'FAIL'})")
    for problem in model.problems[:5]:
        print("  ", problem)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--levels", default="0,1")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--trace", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.tasks, args.stages, args.interval, args.trace)
        return 0

    levels = [int(x) for x in args.levels.split(",")]
    results: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "scale.perfetto-trace"
        for level in levels:
            print(f"== level {level}: {args.tasks} tasks in {args.stages} stages", flush=True)
            result = results[level] = run_child(level, args, trace)
            print(f"{result['seconds']:.1f} s ({result['seconds'] / result['tasks'] * 1e3:.2f} "
                  f"ms/task); driver RSS {result['rss_before'] / MIB:.0f} -> "
                  f"{result['rss_after'] / MIB:.0f} MiB, peak {result['peak_rss'] / MIB:.0f} MiB; "
                  f"RSS growth over the second half: {growth_per_task(result):.0f} B/task")
            if level:
                print(f"trace {result['trace_bytes'] / result['tasks']:.0f} B/task")
            print_samples(result)
            ok = check_trace(trace, result["tasks"]) if level else True
            if not ok:
                return 1
            print()
    if 0 in results and 1 in results:
        p0, p1 = results[0]["peak_rss"], results[1]["peak_rss"]
        print(f"peak driver RSS: level 0 {p0 / MIB:.0f} MiB, level 1 {p1 / MIB:.0f} MiB "
              f"(+{(p1 - p0) / MIB:.0f} MiB, {(p1 - p0) / results[1]['tasks']:.0f} B/task)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

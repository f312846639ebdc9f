"""The runner tracer's own cost in the driver, in instructions per task (repeatable).

Run by hand (it is not a test), from the project root:

    .venv/bin/python benchmarks/bench_driver_cpu.py                        # this checkout
    .venv/bin/python benchmarks/bench_driver_cpu.py --compare /path/to/other/checkout

Wall-time ratios (``bench_runner.py``) move by ±5% from run to run when the
machine is busy; an instruction count does not. This drives
:class:`tracer.ray.RunnerTracer` through a dispatch loop with no Ray (so no
Ray time is counted): waves of 4 tasks created, dispatched, received as a
batch, each with level-1 measurements already in hand (so the execution,
its memory annotations and RSS counters are written), with a fixed clock.
Under ``valgrind --tool=callgrind`` it runs twice, with ``--small`` and
``--large`` tasks; the difference divided by the difference in tasks is the
tracer's instructions per task, net of Python's start-up and imports.

``--compare DIR`` measures another checkout too (its ``tracer`` package
first on ``PYTHONPATH``; build its C extension, or copy this one's, first),
interleaved with this one, and prints the ratio. Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

T0 = 1_800_000_000_000_000_000
ROOT = Path(__file__).resolve().parents[1]


def drive(n: int, ray_events: bool = False) -> float:
    """The dispatch loop of ``n`` tasks; returns the CPU seconds it took.

    ``ray_events``: then draw, after the loop, Ray's events of every task as
    level 1 reads them (five states, the worker's span and three phases, the
    shape of a real no-op task's), 256 tasks a hold of the lock as the
    events channel draws them.
    """
    from tracer.format import TraceWriter
    from tracer.ray import ResourceRequest, RunnerTracer, TracingLevel

    now = [T0]

    def clock() -> int:
        now[0] += 1000
        return now[0]

    with tempfile.TemporaryDirectory() as tmp:
        writer = TraceWriter(Path(tmp) / "t.perfetto-trace", clock=clock, compress=True)
        tracer = RunnerTracer(writer, execution_id="cpu", level=TracingLevel.TIMELINE,
                              cluster_resources={"CPU": 2.0})
        if ray_events:
            tracer._timeline.expect_ray_events()
        facts: list[Any] = []
        req = ResourceRequest(num_cpus=1)
        start = time.process_time()
        for wave in range(n // 4):
            ids = [f"0-{wave * 4 + k}" for k in range(4)]
            with tracer.dispatch_wave(wave) as metrics:
                with tracer.dispatch_batching():
                    for tid in ids:
                        tracer.task_created(tid, 0, req, "map")
                        tracer.mark_handle_task_add_to_batch()
                with tracer.dispatching():
                    for tid in ids:
                        tracer._dispatched(tid)
                        tracer.mark_dispatch_task()
                tracer.count_inflight_tasks(4)
                with tracer.awaiting(num_returns=1, timeout=0.1) as ready:
                    ready(num_ready=4)
                for k, tid in enumerate(ids):
                    begin = now[0] + 100
                    # With Ray's events, each task of a wave on a worker of its own: their
                    # spans overlap, and one worker's would take lanes a real run has not.
                    pid = 100 + (k if ray_events else k % 2)
                    ray_task_id = f"{wave * 4 + k:048x}"
                    # What a traced task's return value would have brought (no Ray here).
                    tracer._tasks[tid].metrics = {
                        "start_ns": begin, "end_ns": begin + 5000, "pid": pid,
                        "node_id": "a" * 40, "ray_task_id": ray_task_id,
                        "assigned_resources": {"CPU": 1.0}, "rss_start": 90 << 20,
                        "rss_end": 91 << 20, "rss_peak": 92 << 20,
                    }
                    if ray_events:
                        facts.append(_ray_task_events(
                            ray_task_id, tracer._tasks[tid].dispatch_ts or begin,
                            begin, pid,
                        ))
                tracer.tasks_received_as_ready(ids)
                metrics(dispatched=4)
        tracer.complete_received()
        for i in range(0, len(facts), 256):
            with tracer._lock:
                tracer._timeline.ray_events(facts[i:i + 256])
        if ray_events and tracer._timeline.ray_events_wanted():
            sys.exit("the simulated Ray events were not all drawn")
        tracer.stage_done(0)
        tracer.close()
        return time.process_time() - start


def _ray_task_events(ray_task_id: str, dispatched: int, begin: int, pid: int) -> Any:
    """Ray's events of one task as the events channel hands them over (times in ns)."""
    from tracer.ray import layout as L
    from tracer.ray.timeline.ray_phases import RayTaskEvents

    return RayTaskEvents(
        ray_task_id=ray_task_id, attempt=0, name="map", node_id="a" * 40, worker_pid=pid,
        states=(
            (L.STATE_PENDING_ARGS, dispatched + 10_000),
            (L.STATE_PENDING_NODE, dispatched + 20_000),
            (L.STATE_SUBMITTED, dispatched + 30_000), (L.STATE_RUNNING, begin - 500),
            (L.STATE_FINISHED, begin + 6000),
        ),
        span=(begin - 1000, begin + 6000),
        phases=(
            (L.PHASE_DESERIALIZE, begin - 900, begin - 100), (L.PHASE_EXECUTE, begin, begin + 5000),
            (L.PHASE_STORE_OUTPUTS, begin + 5100, begin + 5900),
        ),
    )


def instructions(pythonpath: str, n: int, ray_events: bool = False) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, __file__, "--drive", str(n),
             *(["--ray-events"] if ray_events else [])],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": pythonpath},
            check=False,
        )
        match = re.search(r"Collected : (\d+)", proc.stderr)
        if proc.returncode != 0 or match is None:
            sys.exit(f"callgrind failed: {proc.stderr[-2000:]}")
        return int(match.group(1))


def per_task(pythonpath: str, small: int, large: int, ray_events: bool = False) -> float:
    return (
        instructions(pythonpath, large, ray_events) - instructions(pythonpath, small, ray_events)
    ) / (large - small)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=3000)
    parser.add_argument("--compare", type=Path, help="another checkout to measure too")
    parser.add_argument(
        "--ray-events", action="store_true",
        help="also draw Ray's events of every task (level 1's phases and states)",
    )
    parser.add_argument("--drive", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        drive(args.drive, args.ray_events)
        return
    if args.large <= args.small:
        parser.error("--large must be more than --small")
    ours = per_task(str(ROOT), args.small, args.large, args.ray_events)
    print(f"this checkout: {ours / 1000:.1f} k instructions per task")
    if args.compare:
        theirs = per_task(str(args.compare.resolve()), args.small, args.large, args.ray_events)
        print(f"{args.compare}: {theirs / 1000:.1f} k instructions per task")
        print(f"ratio this / other: {ours / theirs:.3f}")


if __name__ == "__main__":
    main()

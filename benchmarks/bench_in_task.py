"""Where a traced task's own measurement time goes, inside real Ray workers (level 1).

Run by hand (it is not a test), from the project root:

    .venv/bin/python benchmarks/bench_in_task.py                 # 3000 no-op tasks
    .venv/bin/python benchmarks/bench_in_task.py --tasks 6000

A level-1 ``tracer.runner.Pipeline`` run of no-op tasks, in a Ray started
here whose workers time, from a ``worker_process_setup_hook``, the level-1
measurement around each task's body (``task_metrics.run_traced``) and its
parts: where the task runs (``_where``: Ray's core worker), the RSS reads
(``rss_and_shared`` and ``peak_rss``, two of each) and packing the return value
(``pack_metrics``). Wall time inside the worker, which for a no-op task is
its CPU, per task, printed per worker.

Timed this way, between two of Ray's calls, on the caches Ray's own work
left: the same calls in a loop in one task (warm) take a fraction of it.
The timers themselves add ~1 µs a part.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

OUT = Path(tempfile.gettempdir()) / "bench_in_task"


def _timing_hook() -> None:
    """Run in every worker at its start: wrap the measurement's parts in timers."""
    import tracer.ray.task_metrics as tm

    parts = {"n": 0, "run_traced": 0, "_where": 0, "rss reads": 0, "pack_metrics": 0}

    def timed(f: Any, key: str) -> Any:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter_ns()
            result = f(*args, **kwargs)
            parts[key] += time.perf_counter_ns() - t
            return result

        return timed_call

    tm._where = timed(tm._where, "_where")
    tm.current_rss = timed(tm.current_rss, "rss reads")
    tm.rss_and_shared = timed(tm.rss_and_shared, "rss reads")  # what tasks read since 33c9c35
    tm.peak_rss = timed(tm.peak_rss, "rss reads")
    tm.pack_metrics = timed(tm.pack_metrics, "pack_metrics")
    real = tm.run_traced

    def run_traced(*args: Any) -> Any:
        t = time.perf_counter_ns()
        result = real(*args)
        parts["run_traced"] += time.perf_counter_ns() - t
        parts["n"] += 1
        if parts["n"] % 250 == 0:
            (OUT / f"{os.getpid()}.json").write_text(json.dumps(parts))
        return result

    tm.run_traced = run_traced


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from bench_runner import task_stage

    from tracer.ray import wait_for_traces
    from tracer.runner import Pipeline

    OUT.mkdir(exist_ok=True)
    for old in glob.glob(str(OUT / "*.json")):
        os.remove(old)
    ray.init(
        num_cpus=os.cpu_count() or 2, object_store_memory=200 * 1024 * 1024,
        include_dashboard=False, log_to_driver=False,
        runtime_env={"worker_process_setup_hook": _timing_hook},
        _system_config={"idle_worker_killing_time_threshold_ms": 10**9},
    )
    try:
        with tempfile.TemporaryDirectory(prefix="bench_in_task.") as tmp:
            path = Path(tmp) / "run.perfetto-trace"
            Pipeline(list(range(args.tasks)), [task_stage()]).run(
                tracing_level=1, trace_path=path, progress=False
            )
            wait_for_traces()
    finally:
        ray.shutdown()
    for name in sorted(glob.glob(str(OUT / "*.json"))):
        parts = json.loads(Path(name).read_text())
        n = parts.pop("n")
        cells = "  ".join(f"{k} {v / n / 1000:5.1f}" for k, v in parts.items())
        print(f"worker {Path(name).stem}: {n} tasks, µs a task: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

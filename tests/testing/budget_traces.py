"""Level-2 runner traces with known memory, written through RunTimeline (no Ray).

What a real run rarely shows on demand: a task killed by Ray's OOM killer, a
task whose measurements never came, a stage with many tasks of known peaks.
Each task is ``(stage, requested, peak)``; ``peak`` None: never measured;
a negative peak: OOM-killed, with ``-peak`` bytes at the kill. At level 1 a
task's peak is its worker's RSS: ``peak`` + WORKER_BASELINE.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tracer.format import TraceWriter
from tracer.ray import ResourceRequest, default_trace_path
from tracer.ray import layout as L
from tracer.ray.levels import TracingLevel
from tracer.ray.timeline import RunTimeline, TimelineTask

MIB = 1 << 20
NODE_ID = "0123456789abcdef"
NODE = "Node 0 (01234567)"
WORKER_BASELINE = 100 * MIB

Task = tuple[str, int | None, int | None]


def write(
    tasks: Sequence[Task], path: Path | None = None, *, level: int = 2,
    cluster_memory: int = 8 * 1024 * MIB, execution_id: str = "synthetic", nodes: int = 1,
    uss: bool = False,
) -> Path:
    """A trace of ``tasks`` (at ``path``, else tracer's default path: $TRACER_TRACE_DIR),
    run on ``nodes`` nodes in turn (each task on the next); ``uss``: each execution also
    has the engine's USS peak (as Ray Data's at level 1)."""
    path = path or default_trace_path("synthetic", execution_id)
    t = 1_000_000_000_000
    with TraceWriter(path, clock=lambda: t) as w:
        run = RunTimeline(
            w, execution_id=execution_id, runner_name="synthetic", level=TracingLevel(level),
            cluster_resources={"CPU": 2.0, "memory": float(cluster_memory)},
            loop_pid=100, loop_tid=100,
        )
        stage_ids: dict[str, int] = {}
        for i, (stage, requested, peak) in enumerate(tasks):
            stage_id = stage_ids.setdefault(stage, len(stage_ids))
            start = t + 1000 * (i + 1)
            task = run.task_created(
                TimelineTask, f"{stage_id}-{i}", stage_id,
                ResourceRequest(memory_bytes=requested), start, stage_name=stage,
            )
            run.task_dispatched(task, start + 10)
            end_args = None
            if peak is not None and peak < 0:
                end_args = {
                    L.ARG_STATUS: L.STATUS_FAILED, L.ARG_ERROR_TYPE: "OutOfMemoryError",
                    L.ARG_MEMORY_AT_KILL: -peak,
                }
            elif peak is not None:
                measured = {
                    "start_ns": start + 20, "end_ns": start + 500,
                    "node_id": NODE_ID if i % nodes == 0 else f"{i % nodes:016x}",
                    "pid": 11 + i % 2, "rss_peak": peak + WORKER_BASELINE,
                }
                if level >= 2:
                    measured["heap_peak"] = peak
                if uss:
                    measured["uss_peak"] = peak + WORKER_BASELINE
                run.execution(measured, task)
            run.task_ended(task, start + 900, end_args)
        run.close()
    return path

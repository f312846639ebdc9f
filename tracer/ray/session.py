"""Opening a trace for one execution: :func:`ray_tracer`."""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tracer.ray.levels import TracingLevel, resolve_level
from tracer.ray.null_tracer import NullRunnerTracer

if TYPE_CHECKING:
    from tracer.format import TraceWriter
    from tracer.ray.runner_tracer import AnyRunnerTracer

logger = logging.getLogger("tracer")

_NULL = NullRunnerTracer()


def new_execution_id() -> str:
    return uuid.uuid4().hex[:12]


@contextlib.contextmanager
def ray_tracer(
    execution_id: str | None = None,
    *,
    runner_name: str = "runner",
    level: int | str | TracingLevel | None = None,
    path: str | os.PathLike[str] | None = None,
    compress: bool = True,
    metrics_actor: bool = False,
    memray_native_traces: bool = False,
    memray_all_allocations: bool = False,
) -> Iterator[AnyRunnerTracer]:
    """Trace one execution of a dispatch loop.

    ``level`` defaults to ``$TRACER_ENABLE_RAY_TRACING`` (0, off, when unset).
    At level 0 this yields a :class:`NullRunnerTracer` and starts nothing. The
    trace goes to ``path``, or by default to the Ray session's log folder
    (``<session>/logs/tracer/<runner>.<execution id>.<timestamp>.perfetto-trace``);
    its path is logged when the execution ends and is ``tracer.trace_path``.
    A path no run can write is refused with a warning, and the execution runs
    untraced: one that is not a regular file (a FIFO, a device), or one that
    another open run is writing (two runs given the same path: the first
    keeps its trace; see :func:`tracer.ray.output.open_trace`).
    ``metrics_actor=True`` also starts the actor channel, for tasks that call
    :func:`collect_ray_task_metrics` themselves. At level 2,
    ``memray_native_traces`` records native stacks and
    ``memray_all_allocations`` records every allocation so executions also
    carry ``total_allocated`` and ``allocation_count`` (both cost more).
    Ray must be initialised.
    """
    lvl = resolve_level(level)
    if lvl == TracingLevel.OFF:
        yield _NULL
        return
    # Imported once tracing is on: a driver at level 0 loads neither the writer nor the
    # tracer (~25 ms of its start-up, ~100 ms where nothing is compiled to .pyc).
    import ray

    from tracer.ray.finishing import wait_for_traces
    from tracer.ray.output import default_trace_path, open_trace
    from tracer.ray.runner_tracer import RunnerTracer

    # An id that is not a string (a runner's int counter) is used as its text: it names
    # the trace's file and the run, where it raised in the default path's making.
    execution_id = new_execution_id() if execution_id in (None, "") else str(execution_id)
    trace_path = Path(path) if path is not None else default_trace_path(runner_name, execution_id)
    writer: TraceWriter | None = None
    actor = None
    try:
        if path is None:
            trace_path.parent.mkdir(parents=True, exist_ok=True)
        wait_for_traces(trace_path)  # an earlier run's trace there still being finished
        writer = open_trace(trace_path, compress=compress)
        totals = ray.cluster_resources() if ray.is_initialized() else {}
        if not ray.is_initialized():
            logger.warning(
                "tracer: Ray is not initialised: call ray.init() before ray_tracer(); "
                "execution %s is traced to %s without the cluster's resources or Ray's "
                "task events",
                execution_id, trace_path,
            )
        if metrics_actor:
            from tracer.ray.metrics_actor import create_metrics_actor

            actor = create_metrics_actor(execution_id)
        tracer = RunnerTracer(
            writer,
            execution_id=execution_id,
            runner_name=runner_name,
            level=lvl,
            cluster_resources=totals,
            metrics_actor=actor,
            memray_native_traces=memray_native_traces,
            memray_all_allocations=memray_all_allocations,
        )
    except Exception as exc:
        # Tracing never breaks the job: run untraced, and say so once.
        logger.warning(
            "tracer: cannot trace execution %s to %s (%s: %s); running untraced",
            execution_id,
            trace_path,
            type(exc).__name__,
            exc,
        )
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        if actor is not None and ray.is_initialized():
            with contextlib.suppress(Exception):
                ray.kill(actor)
        yield _NULL
        return
    error: BaseException | None = None
    abandoned = False
    try:
        yield tracer
    except GeneratorExit:
        # The manager was dropped without its exit (``tracer = ray_tracer(...).__enter__()``
        # with nothing holding the manager: its generator is closed as it is collected;
        # a `with` block's end never closes it). The caller holds the tracer and goes on
        # using it: closing it here left every later call a silent no-op and an empty
        # trace. Its close() or the interpreter's exit closes it (close_at_exit).
        abandoned = True
        return
    except BaseException as exc:
        error = exc
        raise
    finally:
        if not abandoned:
            tracer.close(error)
            # Not after a ray.shutdown(): ray.kill would start a new cluster to kill it in.
            if actor is not None and ray.is_initialized():
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            logger.info(
                "tracer: trace of execution %s written to %s", execution_id, trace_path
            )

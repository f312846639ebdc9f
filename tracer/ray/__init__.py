"""The Ray layer: trace a Ray runner's dispatch loop, tasks, workers and stages.

Typical use in a runner::

    from tracer.ray import ray_tracer, RayFunctionWrapper, ResourceRequest

    with ray_tracer(execution_id, runner_name="my-runner") as tracer:
        with tracer.dispatch_wave(wave) as wave_metrics:
            tracer.task_created(task_id, stage_id, ResourceRequest(1, 0, 2**30), "map")
            ref = RayFunctionWrapper.wrap(my_remote).with_tracing(tracer, task_id).remote(x)
            ...
            tracer.task_received_as_ready(task_id)

The level comes from ``$TRACER_ENABLE_RAY_TRACING`` or ``level=``; at 0
every call is a no-op.
"""

from typing import TYPE_CHECKING, Any

from tracer.ray.finishing import wait_for_traces
from tracer.ray.levels import ENV_VAR, TracingLevel, resolve_level
from tracer.ray.null_tracer import NullRunnerTracer
from tracer.ray.output import default_trace_dir, default_trace_path
from tracer.ray.resources import ResourceRequest
from tracer.ray.runner_tracer import AnyRunnerTracer, RunnerTracer
from tracer.ray.session import new_execution_id, ray_tracer
from tracer.ray.task_metrics import TaskContext, collect_ray_task_metrics

if TYPE_CHECKING:
    from tracer.ray.wrappers import (
        MaterializedPlanWrapper,
        RayFunctionWrapper,
        RayModuleWrapper,
        RayRunnableFunctionWrapper,
    )

# The wrappers import ray (a ~0.2 s import); load them on first use, so that
# tools that only read traces (the CLI, tracer.query) start quickly.
_LAZY = {
    "MaterializedPlanWrapper",
    "RayFunctionWrapper",
    "RayModuleWrapper",
    "RayRunnableFunctionWrapper",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from tracer.ray import wrappers

        return getattr(wrappers, name)
    raise AttributeError(f"module 'tracer.ray' has no attribute {name!r}")

__all__ = [
    "ENV_VAR",
    "AnyRunnerTracer",
    "MaterializedPlanWrapper",
    "NullRunnerTracer",
    "RayFunctionWrapper",
    "RayModuleWrapper",
    "RayRunnableFunctionWrapper",
    "ResourceRequest",
    "RunnerTracer",
    "TaskContext",
    "TracingLevel",
    "collect_ray_task_metrics",
    "default_trace_dir",
    "default_trace_path",
    "new_execution_id",
    "ray_tracer",
    "resolve_level",
    "wait_for_traces",
]

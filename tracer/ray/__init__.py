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

# What a traced task's worker runs: light modules, loaded with the package.
from tracer.ray.levels import ENV_VAR, TracingLevel, resolve_level
from tracer.ray.resources import ResourceRequest
from tracer.ray.task_metrics import TaskContext, collect_ray_task_metrics

if TYPE_CHECKING:
    from tracer.ray.finishing import wait_for_traces
    from tracer.ray.null_tracer import NullRunnerTracer
    from tracer.ray.output import default_trace_dir, default_trace_path
    from tracer.ray.runner_tracer import AnyRunnerTracer, RunnerTracer
    from tracer.ray.session import new_execution_id, ray_tracer
    from tracer.ray.wrappers import (
        MaterializedPlanWrapper,
        RayFunctionWrapper,
        RayModuleWrapper,
        RayRunnableFunctionWrapper,
    )

# The rest is loaded on first use, by the module that holds it. Every Ray worker that
# runs a traced task imports this package (its task's code lives in
# tracer.ray.task_metrics), as does every worker of tracer's own runner at any level:
# loading the writer, the readers and protobuf with it took ~25 ms of each worker's
# CPU (~90 ms where nothing is compiled to .pyc) and delayed its first task as long.
# Tools that only read traces (the CLI, tracer.query) need none of Ray's either.
_LAZY = {
    "wait_for_traces": "tracer.ray.finishing",
    "NullRunnerTracer": "tracer.ray.null_tracer",
    "default_trace_dir": "tracer.ray.output",
    "default_trace_path": "tracer.ray.output",
    "AnyRunnerTracer": "tracer.ray.runner_tracer",
    "RunnerTracer": "tracer.ray.runner_tracer",
    "new_execution_id": "tracer.ray.session",
    "ray_tracer": "tracer.ray.session",
    "MaterializedPlanWrapper": "tracer.ray.wrappers",
    "RayFunctionWrapper": "tracer.ray.wrappers",
    "RayModuleWrapper": "tracer.ray.wrappers",
    "RayRunnableFunctionWrapper": "tracer.ray.wrappers",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tracer.ray' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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

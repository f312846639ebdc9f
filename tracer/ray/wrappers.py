"""Wrappers that let a runner's own Ray calls feed the tracer.

They mirror Daft's: a remote-function wrapper that records dispatch (and
carries the task's measurements back as one extra return value), a plan
wrapper that records task creation and plan polling, and a ``ray.wait``
wrapper that records tasks received as ready.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import ray

from tracer.ray.runner_tracer import AnyRunnerTracer
from tracer.ray.task_metrics import TaskContext, run_traced

T = TypeVar("T")

_TRACED: dict[tuple[Any, ...], tuple[Callable[..., Any], Any]] = {}
_MAX_TRACED = 256


def _traced_remote(remote_fn: Any, ctx: TaskContext, num_returns: int) -> Any:
    """A Ray remote function that runs ``remote_fn``'s body measured.

    What every task of an execution shares (level, memray options, whether
    failed attempts report to a metrics actor, the number of returns) is baked
    into the function, cached per function and configuration; each call sends
    only the task id. Every argument of a call costs the driver Ray's
    serialization: measured on 3000 no-op tasks, the task id alone adds ~17 µs
    of driver CPU per task, where the whole context as a tuple plus the number
    of returns added ~52 µs.
    """
    # The execution id only names the metrics actor: without one, executions share functions.
    execution_id = ctx.execution_id if ctx.metrics_actor else ""
    key = (
        id(remote_fn), execution_id, ctx.level, ctx.memray_native_traces, ctx.metrics_actor,
        ctx.memray_all_allocations, num_returns,
    )
    cached = _TRACED.get(key)
    if cached is not None and cached[0] is remote_fn:
        return cached[1]
    fn = remote_fn._function
    template = TaskContext(
        execution_id, "", None, ctx.level, ctx.memray_native_traces, ctx.metrics_actor,
        ctx.memray_all_allocations,
    )

    def traced(__tracer_task_id: str, *args: Any, **kwargs: Any) -> Any:
        return run_traced(fn, template.for_task(__tracer_task_id), num_returns, args, kwargs)

    # Named like the user's function in Ray's dashboard and errors; not
    # functools.wraps, whose __wrapped__ would make Ray check our arguments
    # against the user's signature.
    traced.__name__ = getattr(fn, "__name__", "task")
    traced.__qualname__ = getattr(fn, "__qualname__", traced.__name__)
    traced.__module__ = getattr(fn, "__module__", __name__)

    options = dict(getattr(remote_fn, "_default_options", {}) or {})
    options.pop("num_returns", None)
    traced_remote = ray.remote(**options)(traced) if options else ray.remote(traced)
    if len(_TRACED) >= _MAX_TRACED:
        _TRACED.clear()
    _TRACED[key] = (remote_fn, traced_remote)
    return traced_remote


@dataclasses.dataclass(frozen=True)
class RayFunctionWrapper:
    """Wraps a Ray remote function so that calls can be traced per task."""

    f: Any
    options_: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def wrap(cls, f: Any) -> RayFunctionWrapper:
        return cls(f=f)

    def options(self, **kwargs: Any) -> RayFunctionWrapper:
        return dataclasses.replace(self, options_={**self.options_, **kwargs})

    def with_tracing(
        self, runner_tracer: AnyRunnerTracer, task_id: str
    ) -> RayRunnableFunctionWrapper:
        return RayRunnableFunctionWrapper(self.f, self.options_, runner_tracer, str(task_id))


@dataclasses.dataclass(frozen=True)
class RayRunnableFunctionWrapper:
    """A traced call of one task: ``.remote(...)`` records the dispatch and submits it."""

    f: Any
    options_: dict[str, Any]
    runner_tracer: AnyRunnerTracer
    task_id: str

    def options(self, **kwargs: Any) -> RayRunnableFunctionWrapper:
        return dataclasses.replace(self, options_={**self.options_, **kwargs})

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        tracer = self.runner_tracer
        if not tracer.enabled or tracer.disabled:
            return _with_options(self.f, self.options_).remote(*args, **kwargs)
        ctx = tracer.task_dispatched(self.task_id)
        n = _fixed_num_returns(self.f, self.options_)
        if ctx is None or n is None:
            return _with_options(self.f, self.options_).remote(*args, **kwargs)
        traced = _traced_remote(self.f, ctx, n)
        refs = _with_options(traced, {**self.options_, "num_returns": n + 1}).remote(
            ctx.task_id, *args, **kwargs
        )
        tracer.register_metrics_ref(self.task_id, refs[-1])
        return refs[0] if n == 1 else refs[:-1]


_OPTIONED: dict[tuple[int, tuple[tuple[str, Any], ...]], tuple[Any, Any]] = {}


def _with_options(f: Any, options: dict[str, Any]) -> Any:
    """``f.options(**options)``, cached: Ray's ``options()`` costs ~11 µs a call,
    and a runner submits every task of a stage with the same options."""
    if not options:
        return f
    try:
        key = (id(f), tuple(sorted(options.items())))
        cached = _OPTIONED.get(key)
    except TypeError:  # an unhashable option value (a dict, a strategy object)
        return f.options(**options)
    if cached is not None and cached[0] is f:
        return cached[1]
    optioned = f.options(**options)
    if len(_OPTIONED) >= 1024:
        _OPTIONED.clear()
    _OPTIONED[key] = (f, optioned)
    return optioned


def _fixed_num_returns(f: Any, options: dict[str, Any]) -> int | None:
    """How many values a call of ``f`` returns, or None when the measurements cannot
    ride along as one more: a generator (Ray streams its values, as it does for
    ``num_returns="streaming"`` or ``"dynamic"``), or no return values at all.
    Such a task runs as it is, untraced inside; the driver's slices still show it.
    """
    value = options.get("num_returns")
    if value is None:
        value = (getattr(f, "_default_options", {}) or {}).get("num_returns")
    if value is None:
        fn = getattr(f, "_function", None)
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            return None
        return 1
    if value.__class__ is not int or value < 1:
        return None
    return int(value)


class MaterializedPlanWrapper(Generic[T]):
    """Wraps a plan iterator: each ``next`` is a plan-polling slice; tasks are recorded as created.

    ``describe(item)`` returns ``(task_id, stage_id, resource_request, instructions)``
    for items that are tasks, or None for other items (e.g. materialised results).
    """

    def __init__(
        self,
        plan: Iterator[T],
        runner_tracer: AnyRunnerTracer,
        describe: Callable[[T], tuple[str, int, Any, str | None] | None],
    ) -> None:
        self.plan = plan
        self.runner_tracer = runner_tracer
        self.describe = describe

    def __iter__(self) -> MaterializedPlanWrapper[T]:
        return self

    def __next__(self) -> T:
        with self.runner_tracer.get_next_physical_plan() as update_args:
            item = next(self.plan)
            update_args(next_item_type=type(item).__name__)
            task = self.describe(item)
            if task is not None:
                task_id, stage_id, request, instructions = task
                self.runner_tracer.task_created(task_id, stage_id, request, instructions)
        return item


class RayModuleWrapper:
    """``ray.wait`` that records which tasks were received as ready."""

    def __init__(self, runner_tracer: AnyRunnerTracer) -> None:
        self._runner_tracer = runner_tracer

    def wait(
        self, task_ids: dict[Any, str], *args: Any, **kwargs: Any
    ) -> tuple[list[Any], list[Any]]:
        readies, not_readies = ray.wait(*args, **kwargs)
        for ready in readies:
            if ready in task_ids:
                self._runner_tracer.task_received_as_ready(task_ids[ready])
        return readies, not_readies

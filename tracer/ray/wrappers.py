"""Wrappers that let a runner's own Ray calls feed the tracer.

They mirror Daft's: a remote-function wrapper that records dispatch (and
has the task report its measurements: as one extra return value, or at
level 1 in one profile event of Ray's own, see ``RunnerTracer``), a plan
wrapper that records task creation and plan polling, and a ``ray.wait``
wrapper that records tasks received as ready.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import ray

from tracer._env import warn_once
from tracer.ray.task_metrics import TaskContext, run_reported_to_ray, run_traced

if TYPE_CHECKING:
    from tracer.ray.runner_tracer import AnyRunnerTracer, RunnerTracer

T = TypeVar("T")

_TRACED: dict[tuple[Any, ...], tuple[Callable[..., Any], Any]] = {}
_MAX_TRACED = 256


def _traced_remote(remote_fn: Any, ctx: TaskContext, num_returns: int) -> Any:
    """A Ray remote function that runs ``remote_fn``'s body measured.

    What every task of an execution shares (level, memray options, whether
    failed attempts report to a metrics actor, the number of returns) is baked
    into the function, cached per function and configuration. A call sends
    nothing more than the user's arguments: every argument costs the driver
    Ray's serialization and the worker its deserialization (measured on 2000
    no-op tasks in a plain Ray loop: a task id argument alone cost ~27 µs of
    wall time and ~65 µs of CPU per task, 3% of a no-op task). The driver
    knows which task's measurements it reads (they come back as that task's
    last return value). Only with a metrics actor does the task get the
    runner's task id, as its first argument: the failed attempts it reports
    through the actor must say which task they were.
    """
    # The execution id only names the metrics actor: without one, executions share functions.
    execution_id = ctx.execution_id if ctx.metrics_actor else ""
    key = (
        id(remote_fn), execution_id, ctx.level, ctx.memray_native_traces, ctx.metrics_actor,
        ctx.memray_all_allocations, ctx.via_ray_events, num_returns,
    )
    cached = _TRACED.get(key)
    if cached is not None and cached[0] is remote_fn:
        return cached[1]
    fn = remote_fn._function
    template = dataclasses.replace(ctx, execution_id=execution_id, task_id="", stage_id=None)

    traced: Callable[..., Any]
    if ctx.via_ray_events:

        def traced(*args: Any, **kwargs: Any) -> Any:
            return run_reported_to_ray(fn, template, args, kwargs)

    elif ctx.metrics_actor:

        def traced(__tracer_task_id: str, *args: Any, **kwargs: Any) -> Any:
            return run_traced(fn, template.for_task(__tracer_task_id), num_returns, args, kwargs)

    else:

        def traced(*args: Any, **kwargs: Any) -> Any:
            return run_traced(fn, template, num_returns, args, kwargs)

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


#: A traced call's remote function with its options applied, and its number of
#: returns (without the measurements), by (function, options, execution settings).
_CALLS: dict[tuple[Any, ...], tuple[Any, Any, int]] = {}


def _traced_call(f: Any, options: dict[str, Any], ctx: TaskContext) -> tuple[Any, int] | None:
    """The optioned traced remote function for a call of ``f`` and its number of returns.

    None when the measurements cannot ride along (see :func:`_fixed_num_returns`).
    Cached: a runner submits every task of a stage with the same function and
    options, and building the call (the options merged, Ray's ``options()``)
    costs ~15 µs.
    """
    try:
        key: tuple[Any, ...] | None = (
            id(f), tuple(options.items()), ctx.metrics_actor and ctx.execution_id, ctx.level,
            ctx.memray_native_traces, ctx.metrics_actor, ctx.memray_all_allocations,
            ctx.via_ray_events,
        )
        cached = _CALLS.get(key)  # type: ignore[arg-type]
    except TypeError:  # an unhashable option value (a dict, a strategy object)
        key, cached = None, None
    if cached is not None and cached[0] is f:
        return cached[1], cached[2]
    n = _fixed_num_returns(f, options)
    if n is None:
        return None
    traced = _traced_remote(f, ctx, n)
    extra = 0 if ctx.via_ray_events else 1  # the return channel's value
    optioned = _with_options(traced, {**options, "num_returns": n + extra})
    if key is not None:
        if len(_CALLS) >= 1024:
            _CALLS.clear()
        _CALLS[key] = (f, optioned, n)
    return optioned, n


@dataclasses.dataclass(frozen=True)
class RayFunctionWrapper:
    """Wraps a Ray remote function so that calls can be traced per task."""

    f: Any
    options_: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def wrap(cls, f: Any) -> RayFunctionWrapper:
        """``f``: a remote function, or what Ray's ``fn.options(...)`` returned (its
        function and options are taken out of it: the wrapper cannot trace a call it
        cannot reach the function of; ``wrap(fn).options(...)`` is the same)."""
        unwrapped = _unwrap_ray_options(f)
        if unwrapped is not None:
            return cls(f=unwrapped[0], options_=unwrapped[1])
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
        if tracer.enabled and not tracer.disabled:
            ctx = _dispatch(tracer, self.task_id)
            call = _traced_call(self.f, self.options_, ctx) if ctx is not None else None
            if ctx is not None and call is not None:
                traced, n = call
                if ctx.metrics_actor:
                    refs = traced.remote(self.task_id, *args, **kwargs)
                else:
                    refs = traced.remote(*args, **kwargs)
                if ctx.via_ray_events:
                    tracer.register_ray_task(self.task_id, refs if n == 1 else refs[0])
                    return refs
                tracer.register_metrics_ref(self.task_id, refs[-1])
                return refs[0] if n == 1 else refs[:-1]
        return _with_options(self.f, self.options_).remote(*args, **kwargs)


#: :class:`RunnerTracer`, once a traced call needs it (the module is the driver's whole
#: tracer: a run at level 0 never loads it).
_RUNNER_TRACER: type[RunnerTracer] | None = None


def _runner_tracer_class() -> type[RunnerTracer]:
    global _RUNNER_TRACER
    from tracer.ray.runner_tracer import RunnerTracer

    _RUNNER_TRACER = RunnerTracer
    return RunnerTracer


def _dispatch(tracer: AnyRunnerTracer, task_id: str) -> TaskContext | None:
    """Record a traced call's dispatch; the context its task runs with, or None if untraced.

    A :class:`RunnerTracer` of our own gives its execution's template (the same
    object for every task: a context per task cost ~1 µs to make); a subclass
    that overrides ``task_dispatched`` is called as such.
    """
    runner_tracer = _RUNNER_TRACER or _runner_tracer_class()
    if isinstance(tracer, runner_tracer) and (
        type(tracer).task_dispatched is runner_tracer.task_dispatched
    ):
        return tracer.task_template if tracer._dispatched(task_id) is not None else None
    return tracer.task_dispatched(task_id)


def _unwrap_ray_options(f: Any) -> tuple[Any, dict[str, Any]] | None:
    """The remote function and options inside what Ray's ``RemoteFunction.options()``
    returns (a ``FuncWrapper`` whose ``remote`` closes over them), or None for anything
    else. Where a Ray of another shape hides them, the calls would run untraced: said
    once."""
    if not type(f).__qualname__.endswith("options.<locals>.FuncWrapper"):
        return None
    try:
        method = f.remote.__func__
        cells = dict(zip(method.__code__.co_freevars, method.__closure__ or (), strict=True))
        fn = cells["func_cls"].cell_contents
        options = cells["updated_options"].cell_contents
        if hasattr(fn, "_function") and isinstance(options, dict):
            return fn, dict(options)
    except (AttributeError, KeyError, ValueError, TypeError):
        pass
    warn_once(
        "tracer: RayFunctionWrapper.wrap() was given a remote function's .options(...), "
        "whose function this Ray does not let tracer reach: its tasks run untraced. "
        "Wrap the function and give the options to the wrapper: "
        "RayFunctionWrapper.wrap(fn).options(...)"
    )
    return None


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
    ride along as one more: a generator function whatever its ``num_returns``
    (Ray takes its values itself: it streams them by default, as for
    ``"streaming"`` or ``"dynamic"``, and with an int it runs the generator and
    stores its first values, checking there are enough; a wrapper's body would
    end before the generator ran, and have one plain value to return), no return
    values at all, or not a remote function (an actor's method: its code is the
    actor's, which tracer does not wrap). Such a call runs as it is, untraced
    inside; the driver's slices still show it.
    """
    fn = getattr(f, "_function", None)
    if fn is None:  # not a remote function: an actor's method, say (its body is the actor's)
        return None
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        return None
    value = options.get("num_returns")
    if value is None:
        value = (getattr(f, "_default_options", {}) or {}).get("num_returns")
    if value is None:
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

"""Daft's own Ray runner, traced by tracer: a stand-in for ``daft.runners.ray_tracing``.

Daft's legacy RayRunner (Daft 0.3.12 to 0.6.14, the ``getdaft`` and ``daft``
packages; ``DAFT_FLOTILLA=0`` or ``use_legacy_ray_runner=True`` in 0.6) is
instrumented with Daft's module ``daft.runners.ray_tracing``, which writes a
Chrome JSON trace. This module has that module's public names and
signatures, built on :mod:`tracer.ray`: the same runner then writes tracer's
native Perfetto trace (tasks with their requests, executions on worker
tracks, stages with an arrow to every execution, memory at level 2).
:func:`install` makes Daft's runner use it::

    import daft
    import tracer.integrations.daft

    tracer.integrations.daft.install()   # before the first query on Ray
    daft.context.set_runner_ray()
    daft.set_execution_config(use_legacy_ray_runner=True, enable_ray_tracing=True)

Daft's switch (``enable_ray_tracing``, ``$DAFT_ENABLE_RAY_TRACING``) turns
tracing on at level 1; ``$TRACER_ENABLE_RAY_TRACING`` turns it on too, and
``TRACER_ENABLE_RAY_TRACING=2`` runs every task under memray. A trace per
execution goes to the Ray session's ``logs/tracer`` folder, named after
Daft's execution id (``daft.<execution id>.<timestamp>.perfetto-trace``).

How Daft's tracer differs, and what is not carried over:

* tasks are measured by the traced call around them (their measurements
  return with their results, see :mod:`tracer.ray.task_metrics`), not by a
  metrics actor that Daft's driver starts and waits for; so
  :func:`collect_ray_task_metrics`, which Daft's task bodies call, adds
  nothing;
* every execution gets an arrow from its own stage (Daft drew one flow id
  per stage, shared by all its executions), and nodes and workers are told
  apart by their full ids (Daft kept 8 characters of each);
* :data:`RunnerTracer` is tracer's :class:`tracer.ray.RunnerTracer`, made
  by :func:`ray_tracer` (Daft's took an open file and a metrics actor), and
  Daft's JSON ``TraceWriter`` has no counterpart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import logging
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracer._env import warn_once
from tracer.errors import InvalidTracingLevelError, TracerError
from tracer.ray import (
    MaterializedPlanWrapper,
    RayFunctionWrapper,
    TracingLevel,
    resolve_level,
)
from tracer.ray import ray_tracer as _tracer_ray_tracer

if TYPE_CHECKING:
    from tracer.ray import AnyRunnerTracer, RunnerTracer

__all__ = [
    "RUNNER_NAME",
    "DaftIntegrationError",
    "MaterializedPhysicalPlanWrapper",
    "RunnerTracer",
    "collect_ray_task_metrics",
    "get_daft_trace_location",
    "get_log_location",
    "install",
    "is_installed",
    "ray_remote_traced",
    "ray_tracer",
    "tracing_level",
    "uninstall",
]

logger = logging.getLogger("tracer")


def __getattr__(name: str) -> Any:
    # RunnerTracer, Daft's name for the tracer, loaded on first use (see with_tracing).
    if name == "RunnerTracer":
        from tracer.ray import RunnerTracer

        return RunnerTracer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The runner's name in the trace (``Scheduler (daft)``) and in its file name.
RUNNER_NAME = "daft"

#: The module this one stands in for, and the runner module that imports it.
DAFT_TRACING_MODULE = "daft.runners.ray_tracing"
DAFT_RUNNER_MODULE = "daft.runners.ray_runner"
#: The Daft versions whose legacy RayRunner imports DAFT_TRACING_MODULE.
SUPPORTED_DAFT = ((0, 3, 12), (0, 6, 14))


class DaftIntegrationError(TracerError, RuntimeError):
    """Daft's runner cannot be made to use this module (Daft missing, or a runner it does
    not recognise)."""


# ------------------------------------------------------------ Daft's names


def get_log_location() -> Path:
    """The Ray session's log folder (Daft's: ``/tmp/ray/session_latest/logs``).

    The running session's own folder, which ``session_latest`` points to only
    for the latest session on the machine.
    """
    from tracer.ray import default_trace_dir

    return default_trace_dir().parent


def get_daft_trace_location(log_location: Path) -> Path:
    """Where traces go in ``log_location``: tracer's folder, ``logs/tracer``.

    Daft's runner also writes its explain-analyze output here
    (``$DAFT_DEV_ENABLE_EXPLAIN_ANALYZE``).
    """
    from tracer.ray import default_trace_dir

    return Path(log_location) / default_trace_dir().name


def tracing_level(daft_execution_config: Any) -> TracingLevel:
    """The level of one execution: Daft's switch gives level 1, tracer's variable any level.

    The higher of the two wins: ``enable_ray_tracing`` alone traces at level
    1, ``TRACER_ENABLE_RAY_TRACING=2`` adds memray. A bad value of tracer's
    variable is warned about (once) and counts as off, as for Ray Data: an
    exception in Daft's scheduler thread would leave the query waiting
    forever.
    """
    daft_level = (
        TracingLevel.TIMELINE
        if getattr(daft_execution_config, "enable_ray_tracing", False)
        else TracingLevel.OFF
    )
    return max(daft_level, _own_level())


def _own_level() -> TracingLevel:
    """``$TRACER_ENABLE_RAY_TRACING``'s level; a bad value: one warning, and off."""
    try:
        return resolve_level(None)
    except InvalidTracingLevelError as exc:
        warn_once(
            f"tracer: {exc}; ignored: Daft's executions are traced only by Daft's own "
            "switch (enable_ray_tracing, at level 1)"
        )
        return TracingLevel.OFF


@contextlib.contextmanager
def ray_tracer(execution_id: str, daft_execution_config: Any) -> Iterator[AnyRunnerTracer]:
    """Trace one execution of Daft's dispatch loop (``Scheduler._run_plan``).

    Yields tracer's :class:`~tracer.ray.RunnerTracer`, or at level 0 its
    :class:`~tracer.ray.NullRunnerTracer` (no file, no thread, no actor).
    """
    level = tracing_level(daft_execution_config)
    with _tracer_ray_tracer(execution_id, runner_name=RUNNER_NAME, level=level) as tracer:
        yield tracer


@dataclasses.dataclass(frozen=True)
class _RayFunctionWrapper:
    """Daft's task functions (``@ray_remote_traced @ray.remote``): ``.options(...)``,
    then ``.with_tracing(runner_tracer, task).remote(...)`` per task."""

    f: Any
    options_: dict[str, Any] = dataclasses.field(default_factory=dict)

    def with_tracing(self, runner_tracer: Any, task: Any) -> Any:
        """A call of ``task`` (Daft's ``PartitionTask``): traced by our tracer when it traces.

        Any other tracer (tracing off, or Daft's own, in an execution that
        started before :func:`install`) gets the call Daft's wrapper made.
        """
        # Looked up here, once tracing is on: Daft's workers import this module (its
        # task functions are wrapped by it), and RunnerTracer is the driver's whole
        # tracer, which a run at level 0 (a NullRunnerTracer) does not load.
        if getattr(runner_tracer, "enabled", False):
            from tracer.ray import RunnerTracer

            if isinstance(runner_tracer, RunnerTracer):
                return RayFunctionWrapper(self.f, self.options_).with_tracing(
                    runner_tracer, task.id()
                )
        return _RayRunnableFunctionWrapper(self.f, self.options_, runner_tracer, task)

    def options(self, *args: Any, **kwargs: Any) -> _RayFunctionWrapper:
        if args:  # as Ray's own options() would
            raise TypeError("options() takes keyword arguments only (Ray's task options)")
        return dataclasses.replace(self, options_={**self.options_, **kwargs})


def ray_remote_traced(f: Any) -> _RayFunctionWrapper:
    """Wraps a Ray remote function so that each call can be traced as one of Daft's tasks.

    >>> @ray_remote_traced
    ... @ray.remote
    ... def f(): ...
    >>> f.options(num_returns=2).with_tracing(runner_tracer, task).remote()
    """
    return _RayFunctionWrapper(f)


@dataclasses.dataclass(frozen=True)
class _RayRunnableFunctionWrapper:
    """An untraced call, made as Daft made it: the tracer told of the dispatch, then Ray's."""

    f: Any
    options_: dict[str, Any]
    runner_tracer: Any
    task: Any

    def options(self, *args: Any, **kwargs: Any) -> _RayRunnableFunctionWrapper:
        if args:
            raise TypeError("options() takes keyword arguments only (Ray's task options)")
        return dataclasses.replace(self, options_={**self.options_, **kwargs})

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self.runner_tracer.task_dispatched(self.task.id())
        f = self.f.options(**self.options_) if self.options_ else self.f
        return f.remote(*args, **kwargs)


class MaterializedPhysicalPlanWrapper(MaterializedPlanWrapper[Any]):
    """Daft's physical plan: each ``next`` a plan-polling slice; its ``PartitionTask``\\ s
    recorded as created, with their stage, resource request and instructions."""

    def __init__(self, plan: Any, runner_tracer: AnyRunnerTracer) -> None:
        from daft.execution.execution_step import PartitionTask

        super().__init__(plan, runner_tracer, functools.partial(_describe, PartitionTask))
        self._traced = runner_tracer.enabled

    def __next__(self) -> Any:
        if not self._traced:  # level 0: the plan's own next, nothing else
            return next(self.plan)
        return super().__next__()


def _describe(partition_task: Any, item: Any) -> tuple[str, int, Any, str | None] | None:
    """A plan item as a created task; None for what is not a Ray task: results, ``None``,
    and tasks without instructions, no-ops that Daft completes in its loop without Ray
    (recorded, they would stay "unfinished" and name their stage "stage N")."""
    if not isinstance(item, partition_task) or not item.instructions:
        return None
    instructions = "-".join(type(i).__name__ for i in item.instructions)
    return item.id(), item.stage_id, item.resource_request, instructions


_NO_METRICS = contextlib.nullcontext()


def collect_ray_task_metrics(
    execution_id: str, task_id: str, stage_id: int, execution_config: Any
) -> contextlib.AbstractContextManager[None]:
    """Daft's task bodies run in this; it measures nothing.

    Daft's tasks are dispatched through :func:`ray_remote_traced` functions,
    whose traced call measures the whole body (and brings the measurements
    back with the task's results); measuring here again would be twice. So
    no metrics actor is started or called, at any level.
    """
    return _NO_METRICS


# ------------------------------------------------------------ installing


#: What install() replaced: Daft's module in sys.modules (None: it was not imported).
_replaced: dict[str, Any] = {}


def is_installed() -> bool:
    """Whether Daft's runner imports this module in place of its own tracer."""
    return sys.modules.get(DAFT_TRACING_MODULE) is sys.modules[__name__]


def install() -> None:
    """Make Daft's RayRunner use this module in place of ``daft.runners.ray_tracing``.

    Call it in the driver, before Daft's first query on Ray: it puts this
    module in ``sys.modules`` under Daft's name, so Daft's runner module
    imports it. If that module was already imported (a query already ran on
    Ray), its names are replaced in it: executions that start afterwards are
    traced. Idempotent; undone by :func:`uninstall`.

    Raises :class:`DaftIntegrationError` when Daft is not installed or its
    runner module does not look like Daft 0.3.12 to 0.6.14's. A bad
    ``$TRACER_ENABLE_RAY_TRACING`` is warned about (once) and counts as off,
    as for Ray Data: tracing never stops a program. Daft's default runner
    in 0.6 (Flotilla) is not traced: a query that asks for tracing there is
    warned about, once. Daft's Ray-client mode (``ray://`` addresses) runs
    the dispatch loop in an actor of its own, which this does not reach.
    """
    _own_level()
    try:
        import daft.runners
    except ImportError as exc:
        raise DaftIntegrationError(
            "tracer.integrations.daft.install() needs Daft: pip install 'tracer[daft]' "
            "(or daft / getdaft 0.3.12 to 0.6.14)"
        ) from exc
    _warn_if_unsupported(getattr(daft, "__version__", ""))
    this = sys.modules[__name__]
    if not is_installed():
        _replaced["module"] = sys.modules.get(DAFT_TRACING_MODULE)
        sys.modules[DAFT_TRACING_MODULE] = this
    daft.runners.ray_tracing = this
    _hook_flotilla()
    runner = sys.modules.get(DAFT_RUNNER_MODULE)
    if runner is None or getattr(runner, "ray_tracing", None) is this:
        return  # it will import this module, or did
    try:
        _swap_in_runner(runner, this, _is_daft_wrapper, ray_remote_traced)
    except DaftIntegrationError:
        uninstall()
        raise


def uninstall() -> None:
    """Give Daft's runner its own ``daft.runners.ray_tracing`` back (no-op if not installed)."""
    if not is_installed():
        return
    import daft.runners

    _unhook_flotilla()
    original = _replaced.pop("module", None)
    if original is None:
        del sys.modules[DAFT_TRACING_MODULE]
        if getattr(daft.runners, "ray_tracing", None) is sys.modules[__name__]:
            del daft.runners.ray_tracing
    else:
        sys.modules[DAFT_TRACING_MODULE] = original
        daft.runners.ray_tracing = original
    runner = sys.modules.get(DAFT_RUNNER_MODULE)
    if runner is not None and getattr(runner, "ray_tracing", None) is sys.modules[__name__]:
        daft_tracing = importlib.import_module(DAFT_TRACING_MODULE)  # Daft's own
        _swap_in_runner(
            runner, daft_tracing, lambda v: isinstance(v, _RayFunctionWrapper),
            lambda v: daft_tracing.ray_remote_traced(v),
        )


def _is_daft_wrapper(value: Any) -> bool:
    """One of Daft's task functions as Daft's own ``ray_remote_traced`` wrapped it."""
    cls = type(value)
    return (
        cls.__name__ == "_RayFunctionWrapper"
        and cls.__module__ == DAFT_TRACING_MODULE
        and hasattr(value, "f")
        and hasattr(value, "with_tracing")
    )


def _swap_in_runner(
    runner: Any, tracing: Any, is_wrapped: Callable[[Any], bool], wrap: Callable[[Any], Any]
) -> None:
    """Point an imported ``daft.runners.ray_runner`` at ``tracing``.

    It reads ``ray_tracing.<name>`` when it runs (``ray_tracer``, the plan
    wrapper, and in its tasks ``collect_ray_task_metrics``), but its task
    functions were wrapped when it was imported: those are wrapped again,
    around the same Ray remote functions.
    """
    current = getattr(runner, "ray_tracing", None)
    wrapped = {
        name: value for name, value in vars(runner).items()
        if is_wrapped(value) and hasattr(value, "f")
    }
    if current is None or not wrapped:
        raise DaftIntegrationError(
            f"{DAFT_RUNNER_MODULE} was imported before tracer.integrations.daft.install() "
            "and does not look like the RayRunner of Daft 0.3.12 to 0.6.14 (no ray_tracing "
            "module, or no task functions wrapped by ray_remote_traced), so it cannot be "
            "traced; call install() before Daft's first query on Ray, right after "
            "`import daft`"
        )
    runner.ray_tracing = tracing
    for name, value in wrapped.items():
        setattr(runner, name, wrap(value.f))


#: Daft's default Ray runner in 0.6 (Flotilla), which does not use DAFT_TRACING_MODULE.
DAFT_FLOTILLA_MODULE = "daft.runners.flotilla"
#: Said once per process when a query asks for tracing on Daft's default runner.
FLOTILLA_WARNING = (
    "tracer: this Daft query runs on Daft's default Ray runner (Flotilla), which is not "
    "traced (no trace is written): tracing needs Daft's legacy Ray runner, "
    "daft.set_execution_config(use_legacy_ray_runner=True) or DAFT_FLOTILLA=0"
)


def _hook_flotilla() -> None:
    """Warn when a query that asks for tracing runs on Daft's default runner.

    That runner never calls this module (Daft's own tracing is the legacy
    runner's): without a word, the query would just write no trace. So
    ``FlotillaRunner.stream_plan``, which starts each of its queries, first
    checks the execution's level (read as the legacy runner reads it).
    """
    try:
        flotilla = importlib.import_module(DAFT_FLOTILLA_MODULE)
        runner_cls = flotilla.FlotillaRunner
        original = runner_cls.__dict__["stream_plan"]
    except Exception:  # a Daft without it (older): the legacy runner only
        return
    if getattr(original, "__tracer_hook__", False):
        return

    @functools.wraps(original)
    def stream_plan(self: Any, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):  # never into Daft's query
            from daft.context import get_context

            if tracing_level(get_context().daft_execution_config) > TracingLevel.OFF:
                warn_once(FLOTILLA_WARNING)
        return original(self, *args, **kwargs)

    stream_plan.__tracer_hook__ = True  # type: ignore[attr-defined]
    runner_cls.stream_plan = stream_plan


def _unhook_flotilla() -> None:
    flotilla = sys.modules.get(DAFT_FLOTILLA_MODULE)
    runner_cls = getattr(flotilla, "FlotillaRunner", None)
    current = getattr(runner_cls, "__dict__", {}).get("stream_plan")
    if getattr(current, "__tracer_hook__", False):
        runner_cls.stream_plan = current.__wrapped__  # type: ignore[union-attr]


def _warn_if_unsupported(version: str) -> None:
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:3])
    if len(numbers) == 3 and not SUPPORTED_DAFT[0] <= numbers <= SUPPORTED_DAFT[1]:
        logger.warning(
            "tracer: Daft %s: tracer.integrations.daft traces the legacy RayRunner of Daft "
            "0.3.12 to 0.6.14; this version's runner may not use it", version,
        )

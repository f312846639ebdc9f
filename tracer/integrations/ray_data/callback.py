"""Switching tracing on for Ray Data: the execution callback, :func:`enable`, :func:`disable`.

Ray Data creates :class:`TracingCallback` itself when
``RAY_DATA_EXECUTION_CALLBACKS`` names it (the level then comes from
``TRACER_ENABLE_RAY_TRACING``), or :func:`enable` adds it to the current
``DataContext`` (with its level and folder in the context's config, which
wins over the environment). At level 0 (or unset) the callback does nothing
but read the level once per execution: no file, no actor, no hook.

When tracing is on, two things happen for each execution:

* before each map operator starts (a hook on ``MapOperator.start``,
  installed once per process, see :mod:`._compat`), its transformer is made
  to measure its tasks (:mod:`.worker`) and the operator gets a token;
* when the execution starts, an :class:`~.execution.ExecutionTracer` opens
  its trace (``<session>/logs/tracer/ray-data.<dataset>.<timestamp>.perfetto-trace``,
  or in :func:`enable`'s folder), then the job's metrics actor starts if it
  is not up (:mod:`.channel`), and it hooks the operators' task metrics; it
  follows every scheduling step and closes the trace when the execution
  succeeds or fails, logging where the trace is.

Tracing never breaks the pipeline: a bad level in the environment, a Ray too
old, a trace that cannot be created, an error while tracing: one warning,
and the pipeline runs (on) untraced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracer._env import warn_once
from tracer.errors import InvalidTracingLevelError
from tracer.integrations.ray_data import _compat as compat
from tracer.integrations.ray_data.channel import channel
from tracer.ray.levels import TracingLevel, resolve_level

if TYPE_CHECKING:
    from tracer.format import TraceWriter
    from tracer.integrations.ray_data.execution import ExecutionTracer

# The trace writer and the execution's tracer (the run timeline, the format layer:
# ~65 ms of imports without .pyc files) are imported once an execution is traced:
# Ray Data creates this callback (RAY_DATA_EXECUTION_CALLBACKS) whatever the level.

try:  # a Ray Data without it (older than the integration supports) must still import this
    from ray.data._internal.execution.execution_callback import ExecutionCallback
except Exception:  # pragma: no cover - depends on the installed Ray
    ExecutionCallback = object

__all__ = ["CONFIG_KEY", "Settings", "TracingCallback", "disable", "enable", "settings",
           "trace_paths"]

logger = logging.getLogger("tracer")

#: Where :func:`enable` keeps its settings in a ``DataContext``'s config.
CONFIG_KEY = "tracer.ray_data"
#: Ray Data's variable naming the callbacks it creates for every execution.
CALLBACKS_ENV_VAR = "RAY_DATA_EXECUTION_CALLBACKS"
#: The attribute of a traced executor: (the callback that traces it, its tracer or None).
_EXECUTOR_ATTR = "_tracer_ray_data"
#: The attribute of a traced operator: its token.
_TOKEN_ATTR = "_tracer_token"

_PATHS: deque[Path] = deque(maxlen=100)


@dataclasses.dataclass(frozen=True)
class Settings:
    """How an execution is traced: its level, and the folder of its trace (None: the
    Ray session's ``logs/tracer``)."""

    level: TracingLevel
    folder: Path | None = None


def settings(context: Any) -> Settings:
    """The settings for executions of ``context``: :func:`enable`'s, else the environment's.

    A bad ``TRACER_ENABLE_RAY_TRACING`` is warned about (once) and means off.
    """
    cfg = None
    with contextlib.suppress(Exception):
        cfg = context.get_config(CONFIG_KEY) if context is not None else None
    if isinstance(cfg, dict):
        folder = cfg.get("folder")
        return Settings(TracingLevel(int(cfg.get("level", 0))), Path(folder) if folder else None)
    try:
        return Settings(resolve_level(None))
    except InvalidTracingLevelError as exc:
        warn_once(f"tracer: {exc}; Ray Data runs untraced")
        return Settings(TracingLevel.OFF)


def enable(
    level: int | str | TracingLevel | None = None,
    path: str | os.PathLike[str] | None = None,
) -> bool:
    """Trace every Ray Data execution of the current ``DataContext`` from now on.

    ``level``: 1 (timeline) or 2 (plus memray in every map task); 0 turns
    tracing off (:func:`disable`). Not given: ``$TRACER_ENABLE_RAY_TRACING``
    when set, else 1 (so that a harness that sets the variable, such as
    :mod:`tracer.testing`'s measured blocks at level 2, or a job's ``=0``,
    decides for code that calls ``enable()``). ``path``: the folder the traces go to (one
    file per execution, created as needed), by default the Ray session's
    ``logs/tracer``. A bad level raises
    :class:`~tracer.errors.InvalidTracingLevelError`; a path that is an
    existing file, :class:`ValueError`. Returns whether tracing is on: a Ray
    too old for the integration is warned about and left untraced.
    Call it before creating the datasets to trace (a dataset keeps a copy of
    the context it was created in).
    """
    lvl = resolve_level(level, default=TracingLevel.TIMELINE)
    if path is not None and Path(path).is_file():
        raise ValueError(
            f"path= is the folder for Ray Data traces (one per execution), not a file: {path}"
        )
    if lvl == TracingLevel.OFF:
        disable()
        return False
    reason = compat.unsupported_reason()
    if reason is not None:
        warn_once(f"tracer: {reason}; Ray Data runs untraced")
        return False
    from ray.data import DataContext

    context = DataContext.get_current()
    context.set_config(
        CONFIG_KEY, {"level": int(lvl), "folder": None if path is None else str(path)}
    )
    compat.register_callback(context, TracingCallback)
    compat.install_start_hook(_on_operator_start)
    return True


def disable() -> None:
    """Stop tracing the current ``DataContext``'s executions (those under way finish
    traced); once none is under way, the job's metrics actor is removed too."""
    from ray.data import DataContext

    context = DataContext.get_current()
    with contextlib.suppress(Exception):
        context.remove_config(CONFIG_KEY)
    with contextlib.suppress(Exception):
        compat.unregister_callback(context, TracingCallback)
    channel().stop()


def trace_paths() -> list[Path]:
    """The traces of this process's Ray Data executions, oldest first (the last 100)."""
    return list(_PATHS)


class TracingCallback(ExecutionCallback):  # type: ignore[misc]
    """Ray Data's execution callback that traces each execution (see the module doc).

    Up to Ray 2.54 one instance serves every execution of a context (and is
    pickled to workers with it: it pickles as a fresh, empty instance); from
    2.55 Ray Data makes one per execution. Either way the state lives with
    the executor, and an execution is traced once even when the callback is
    registered twice (environment and :func:`enable`).
    """

    def __init__(self) -> None:
        super().__init__()
        with contextlib.suppress(Exception):
            if compat.unsupported_reason() is None:
                from ray.data import DataContext

                # Up to Ray 2.54 this one instance serves every later execution, whose
                # level is read as it starts: the hook (a level check per operator
                # start) must be in place before.
                if compat.callbacks_shared() or (
                    settings(DataContext.get_current()).level > TracingLevel.OFF
                ):
                    compat.install_start_hook(_on_operator_start)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_fresh_callback, ())

    def before_execution_starts(self, executor: Any) -> None:
        if getattr(executor, _EXECUTOR_ATTR, None) is not None:
            return  # another registration of this callback traces it
        tracer = _start_execution(executor)
        with contextlib.suppress(Exception):
            setattr(executor, _EXECUTOR_ATTR, (self, tracer))

    def _tracer(self, executor: Any) -> ExecutionTracer | None:
        owner = getattr(executor, _EXECUTOR_ATTR, None)
        if owner is None or owner[0] is not self:
            return None
        tracer: ExecutionTracer | None = owner[1]  # (only _start_execution's are set)
        return tracer

    def on_execution_step(self, executor: Any) -> None:
        tracer = self._tracer(executor)
        if tracer is not None:
            tracer.step()

    def after_execution_succeeds(self, executor: Any) -> None:
        self._close(executor, None)

    def after_execution_fails(self, executor: Any, error: Exception) -> None:
        self._close(executor, error)

    def _close(self, executor: Any, error: BaseException | None) -> None:
        tracer = self._tracer(executor)
        if tracer is None:
            return
        try:
            tracer.close(error)
        except Exception as exc:  # never into Ray Data
            warn_once(f"tracer: closing the Ray Data trace failed ({type(exc).__name__}: {exc})")


def _fresh_callback() -> TracingCallback:
    """A callback unpickled in a worker: empty, and nothing set up there."""
    return TracingCallback.__new__(TracingCallback)


def _on_operator_start(op: Any) -> None:
    """Before a map operator starts: make its tasks measure themselves (if traced).

    The hook stays installed for the process, and the environment's level
    applies to any context: an operator is measured only where a tracing
    callback will see its execution (:func:`enable`'s, one registered on the
    context, or one ``RAY_DATA_EXECUTION_CALLBACKS`` names). Else its tasks
    would measure for no trace, and their workers, finding no metrics actor
    under the channel's key, would remember that for the next traced run.
    """
    try:
        context = getattr(op, "data_context", None)
        lvl = settings(context).level
        if lvl == TracingLevel.OFF or compat.unsupported_reason() is not None:
            return
        if context is None:
            from ray.data import DataContext

            context = DataContext.get_current()
        if not compat.callback_registered(context, TracingCallback) and not _named_in_environment(
            os.environ.get(CALLBACKS_ENV_VAR, "")
        ):
            return
        # When its actors (an actor pool's) were created: before the execution's trace.
        setattr(op, compat.STARTED_ATTR, time.time_ns())
        _measure_operator(op, lvl)
    except Exception as exc:
        _unmeasured(exc)


def _measure_operator(op: Any, lvl: TracingLevel) -> None:
    try:
        from tracer.integrations.ray_data.execution import new_token
        from tracer.integrations.ray_data.worker import MeasureSpec, trace_transformer

        token = new_token()
        spec = MeasureSpec(channel().key(), token, int(lvl))
        if trace_transformer(compat.map_transformer(op), spec):
            setattr(op, _TOKEN_ATTR, token)
    except Exception as exc:
        _unmeasured(exc)


def _unmeasured(exc: Exception) -> None:
    warn_once(
        f"tracer: Ray Data tasks cannot measure themselves ({type(exc).__name__}: {exc}); "
        "they are traced from the driver only"
    )


@functools.lru_cache(maxsize=8)
def _named_in_environment(names: str) -> bool:
    """Whether ``RAY_DATA_EXECUTION_CALLBACKS`` (``names``) names a :class:`TracingCallback`
    (or a subclass), resolved as Ray Data does: ``module.Class``, comma-separated."""
    for name in names.split(","):
        module_name, _, cls_name = name.strip().rpartition(".")
        if not module_name:
            continue
        with contextlib.suppress(Exception):
            cls = getattr(importlib.import_module(module_name), cls_name)
            if isinstance(cls, type) and issubclass(cls, TracingCallback):
                return True
    return False


def _start_execution(executor: Any) -> ExecutionTracer | None:
    """The tracer of a starting execution, or None (off, unsupported, or it cannot start)."""
    reason = compat.unsupported_reason()
    if reason is not None:
        warn_once(f"tracer: {reason}; Ray Data runs untraced")
        return None
    s = settings(compat.data_context(executor))
    if s.level == TracingLevel.OFF:
        return None
    from tracer.integrations.ray_data.execution import RUNNER_NAME, ExecutionTracer
    from tracer.ray.output import default_trace_path, open_trace

    dataset = compat.dataset_id(executor)
    path = default_trace_path(RUNNER_NAME, dataset)
    if s.folder is not None:
        path = s.folder / path.name
    writer: TraceWriter | None = None
    ops: list[Any] = []
    try:
        # A callback created while tracing was off (one instance for every execution,
        # Ray before 2.55) set nothing up: from this execution on, it is set up.
        compat.install_start_hook(_on_operator_start)
        ops = compat.operators(executor)
        for op in ops:
            if not hasattr(op, _TOKEN_ATTR) and compat.is_map_operator(op) and (
                compat.transformer_not_sent(op)
            ):
                _measure_operator(op, s.level)
        tokens = {id(op): getattr(op, _TOKEN_ATTR) for op in ops if hasattr(op, _TOKEN_ATTR)}
        unmeasured = [
            str(getattr(op, "name", op)) for op in ops
            if id(op) not in tokens and compat.is_map_operator(op)
        ]
        if unmeasured:
            warn_once(
                f"tracer: the tasks of {', '.join(unmeasured)} are traced from the driver only "
                "(the operators started before tracing was set up: with Ray before 2.55 and "
                "RAY_DATA_EXECUTION_CALLBACKS, the first execution of a DataContext; "
                "tracer.integrations.ray_data.enable() has no such gap)"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = open_trace(path)
        if tokens:  # the job's metrics actor, once the trace is open: none for a run untraced
            channel().start()
        tracer = ExecutionTracer(executor, writer, s.level, channel(), tokens)
    except Exception as exc:
        logger.warning(
            "tracer: cannot trace Ray Data execution %s to %s (%s: %s); running untraced",
            dataset, path, type(exc).__name__, exc,
        )
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        with contextlib.suppress(Exception):
            _untrace(ops)
            channel().not_started()
        return None
    _PATHS.append(path)
    return tracer


def _untrace(ops: list[Any]) -> None:
    """An execution that runs untraced after all: its tasks measure nothing where their
    operator's transformer is still to be sent (task pools, Ray 2.54+); the others'
    measurements find no actor and are dropped."""
    for op in ops:
        if hasattr(op, _TOKEN_ATTR):
            delattr(op, _TOKEN_ATTR)
            transformer = compat.map_transformer(op)
            if getattr(transformer, "_tracer_spec", None) is not None:
                transformer._tracer_spec = None


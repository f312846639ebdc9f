"""Inside Ray Data's workers: every map task measured, its measurements sent to the driver.

Ray Data runs each task of a map operator as ``_map_task(map_transformer,
...)``, in a task-pool worker or an actor-pool actor alike, and the
operator's ``MapTransformer`` (pickled to every task or actor) is the one
object of the driver's that every task runs through. When the driver
traces, the operator's transformer becomes a :class:`TracedMapTransformer`
before the operator starts (see :mod:`._compat`): its ``apply_transform``
wraps the task's output blocks in :func:`~tracer.ray.task_metrics.measure_task`,
from the first block Ray Data asks for to the last one (or the error): when,
where (node, worker pid, Ray's task id), the worker's RSS, and at level 2
the task under memray.

The measurements reach the driver through the job's metrics actor: a Ray
Data map task is a streaming generator, so it has no last return value to
carry them, as the runner's tasks do. One actor call per task cost ~2 ms of
CPU all told (the task's call, the actor's handling of it), 15% of a small
Ray Data task on 2 cores: so each worker process keeps its measurements in
an outbox that a thread of its own sends in one call every
:data:`FLUSH_DELAY_S` (or at :data:`MAX_BATCH`), and when the process exits.
Not in an actor-pool actor, which Ray Data kills as soon as its operator is
done: there each task's measurements go at once.

A task's own exception goes on unchanged: the copy of the
measurements that :func:`measure_task` attaches to it is taken off again.
Ray Data wraps a UDF's exception in its ``UserCodeException``: the
execution is annotated with the UDF's own (type and message).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from ray.data._internal.execution.operators.map_transformer import MapTransformer

from tracer.ray.metrics_actor import send_to_metrics_actor
from tracer.ray.task_metrics import Metrics, TaskContext, measure_task

__all__ = ["FLUSH_DELAY_S", "MAX_BATCH", "MeasureSpec", "TracedMapTransformer", "trace_transformer"]

#: A worker's measurements wait this long for others to go with them in one call.
FLUSH_DELAY_S = 0.05
#: ... or until there are this many.
MAX_BATCH = 256


@dataclasses.dataclass(frozen=True)
class MeasureSpec:
    """What a traced operator's tasks need to measure themselves and report.

    ``channel``: the job's metrics actor key; ``op``: the operator's token,
    which the driver maps to its execution and stage; ``level``: 1 or 2.
    """

    channel: str
    op: str
    level: int


class TracedMapTransformer(MapTransformer):  # type: ignore[misc]  # Ray's class is untyped
    """Ray Data's ``MapTransformer`` whose tasks measure themselves (see the module doc).

    Made by swapping the class of the operator's own transformer
    (:func:`trace_transformer`), so that everything else about it, and every
    ``isinstance`` check, stays Ray Data's.
    """

    _tracer_spec: MeasureSpec

    def apply_transform(
        self, input_blocks: Iterable[Any], ctx: Any, *args: Any, **kwargs: Any
    ) -> Any:
        blocks = super().apply_transform(input_blocks, ctx, *args, **kwargs)
        spec = getattr(self, "_tracer_spec", None)
        if spec is None:
            return blocks
        return _measured(blocks, spec, int(getattr(ctx, "task_idx", -1)))

    def fuse(self, other: Any) -> Any:
        """Ray Data fuses a split step in when an operator starts: the result stays traced."""
        fused = super().fuse(other)
        trace_transformer(fused, self._tracer_spec)
        return fused


def trace_transformer(transformer: Any, spec: MeasureSpec) -> bool:
    """Make ``transformer`` measure its tasks; False if it is not a plain ``MapTransformer``."""
    cls = type(transformer)
    if cls is MapTransformer:
        transformer.__class__ = TracedMapTransformer
    elif cls is not TracedMapTransformer:
        return False
    transformer._tracer_spec = spec
    return True


def _measured(blocks: Iterable[Any], spec: MeasureSpec, task_idx: int) -> Iterator[Any]:
    """The task's blocks, measured from the first asked for to the last (or the error).

    A consumer that stops early (``close()``) ends the measurement as it is.
    """
    ctx = TaskContext(spec.channel, "", None, spec.level)

    def sink(metrics: Metrics) -> None:
        metrics["op"] = spec.op
        metrics["task_idx"] = task_idx
        user = metrics.pop("user_error", None)
        if user is not None:  # the UDF's own exception, not Ray Data's wrapper of it
            metrics["error_type"], metrics["error"] = user
        _OUTBOX.add(spec.channel, metrics)

    try:
        with measure_task(ctx, sink) as metrics:
            try:
                yield from blocks
            except GeneratorExit:
                return
            except BaseException as exc:
                cause = exc.__cause__
                if type(exc).__name__ == "UserCodeException" and isinstance(cause, BaseException):
                    metrics["user_error"] = (type(cause).__name__, str(cause)[:500])
                raise
    except BaseException as exc:
        with contextlib.suppress(Exception):
            del exc.__tracer_metrics__  # type: ignore[attr-defined]
        raise


class _Outbox:
    """This worker process's measurements on their way to the metrics actor, in batches.

    The first measurement of a batch wakes the sender thread, which waits
    :data:`FLUSH_DELAY_S` for more and sends each channel's batch (a list)
    as one fire-and-forget call. The thread starts with the first
    measurement (again in a forked child); the batch left at exit is sent
    then.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, list[Metrics]] = {}
        self._wake = threading.Event()
        self._pid = 0  # the process whose sender thread runs
        self._in_actor = False

    def add(self, channel: str, metrics: Metrics) -> None:
        with self._lock:
            if self._pid != os.getpid():
                self._start()
            batch = self._items.setdefault(channel, [])
            batch.append(metrics)
            size = len(batch)
        if size >= MAX_BATCH or self._in_actor:
            self.flush()
        elif size == 1:
            self._wake.set()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._wake = threading.Event()
        self._items = {}
        # An actor-pool actor is killed as soon as its operator is done (no exit
        # handlers run): its measurements go at once, one call per task.
        self._in_actor = _in_actor()
        if not self._in_actor:
            threading.Thread(target=self._run, name="tracer-ray-data-outbox", daemon=True).start()
            atexit.register(self.flush)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(FLUSH_DELAY_S)
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        with self._lock:
            items, self._items = self._items, {}
        for channel, batch in items.items():
            with contextlib.suppress(Exception):  # tracing never breaks the worker
                send_to_metrics_actor(channel, batch)  # type: ignore[arg-type]


def _in_actor() -> bool:
    try:
        import ray

        return ray.get_runtime_context().get_actor_id() is not None
    except Exception:
        return False


_OUTBOX = _Outbox()

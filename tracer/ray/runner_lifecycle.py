"""The runner tracer's trace lifecycle: flushing, closing, and stopping after an error.

Why apart from the tasks' calls: these are the calls that touch the disk
and Ray's events at the end of a run, and the only ones that may run on
another thread (the flusher's, the finishing thread's), so their rules are
about threads and time rather than tasks. Flushing takes the events under
the tracer's lock and writes the disk outside it (the dispatch loop never
waits for the disk); closing writes everything but Ray's last events at
once and leaves those to a thread (:mod:`tracer.ray.finishing`); the first
error writing the trace logs one warning and turns the tracer into a no-op,
with the trace so far on disk.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from tracer.errors import TraceWriteError
from tracer.format import TraceWriter
from tracer.ray import layout as L
from tracer.ray.actor_channel import CLOSE_GRACE_S, ActorChannel
from tracer.ray.connection import ray_connected
from tracer.ray.events_channel import RayEventsChannel
from tracer.ray.failures import Failures
from tracer.ray.finishing import finish_trace
from tracer.ray.flusher import Flusher
from tracer.ray.guard import guarded
from tracer.ray.return_channel import ReturnChannel
from tracer.ray.runner_task import RunnerTask
from tracer.ray.task_errors import error_args
from tracer.ray.timeline import RunTimeline

logger = logging.getLogger("tracer")

__all__ = ["DriverExitedError", "LifecycleCalls", "close_at_exit"]


class DriverExitedError(Exception):
    """What a run's trace says ended it when the driver exited with its tracer still open."""


_open: weakref.WeakSet[LifecycleCalls] = weakref.WeakSet()
_open_lock = threading.Lock()
_atexit_registered = False


def close_at_exit(tracer: LifecycleCalls) -> None:
    """Close ``tracer`` at the interpreter's exit if its runner never does.

    A driver that returns (or calls ``sys.exit``) with a tracer open left its
    trace to whatever its threads managed while Python tore down: the last
    second of the run missing, its slices never ended, and a warning blaming
    an ``ImportError`` at shutdown. Closed here instead, before Ray's own
    exit handler shuts Ray down (``atexit`` runs the last registered first,
    and Ray registered its handler at ``ray.init``, before any tracer), the
    trace ends like any other, its run's slice marked ``DriverExitedError``.
    """
    global _atexit_registered
    with _open_lock:
        _open.add(tracer)
        if not _atexit_registered:
            atexit.register(_close_open_tracers)
            _atexit_registered = True


def _close_open_tracers() -> None:
    with _open_lock:
        tracers = list(_open)
        _open.clear()
    for tracer in tracers:
        if tracer._closed:
            continue
        logger.warning(
            "tracer: the driver is exiting with the trace of execution %s still open; "
            "closing it (%s)", tracer.execution_id, tracer.trace_path,
        )
        with contextlib.suppress(Exception):  # nothing may stop the interpreter's exit
            tracer.close(
                DriverExitedError("the driver exited with the tracer still open"), wait=True
            )


class LifecycleCalls:
    """The trace-lifecycle half of :class:`~tracer.ray.RunnerTracer`'s API (a mixin)."""

    # Provided by RunnerTracer.
    writer: TraceWriter
    execution_id: str
    trace_path: Path
    _lock: threading.RLock
    _disabled: bool
    _failed: bool
    _closed: bool
    _ray_at_start: bool
    _flusher: Flusher
    _timeline: RunTimeline
    _ray_events: RayEventsChannel | None
    _tasks: dict[str, RunnerTask]
    _actor: ActorChannel | None
    _returns: ReturnChannel
    _failures: Failures
    _unreported: dict[str, BaseException]

    def _complete_received(self) -> None:
        raise NotImplementedError

    def _drain_metrics(self) -> None:
        raise NotImplementedError

    def _poll_cancelled(self, timeout: float) -> None:
        raise NotImplementedError

    def _finish_task(self, task: RunnerTask, now: int, args: dict[str, Any] | None) -> None:
        raise NotImplementedError

    def _disable(self, exc: BaseException) -> None:
        if self._disabled:
            return
        self._disabled = self._failed = True
        self._flusher.stop()
        if self._ray_events is not None:  # no more reads of Ray's events
            with contextlib.suppress(Exception):
                self._ray_events.stop()
        self._timeline.stop_driver_gc()
        logger.warning(
            "tracer: tracing stopped for execution %s after an error (%s: %s); "
            "the run continues untraced; the trace so far is in %s",
            self.execution_id,
            type(exc).__name__,
            exc,
            self.trace_path,
        )
        with contextlib.suppress(Exception):
            self.writer.close()

    @property
    def disabled(self) -> bool:
        """True once tracing stopped after an error."""
        return self._failed

    def flush(self) -> None:
        """Write everything buffered to the file; stop tracing if the file was removed.

        Safe from any thread: the events are taken under the tracer's lock,
        the disk is written outside it, so the dispatch loop never waits for
        the disk (in a Ray driver, any system call may also cost a GIL
        hand-over).
        """
        if self._disabled or self._closed:
            return
        if self._ray_events is not None:
            try:
                self._ray_events.poll()
            except Exception as exc:  # Ray's events are extra: losing them stops nothing
                logger.debug("tracer: reading Ray's task events failed: %s", exc)
        try:
            with self._lock:
                if self._disabled or self._closed:
                    return
                self._timeline.draw_driver_gc()
                self.writer.detach()
            self.writer.write_detached()
            self._flusher.last_flush = time.monotonic()
            # On Linux, writes to a removed file succeed and vanish: check it is there.
            if self.writer.file_removed():
                raise TraceWriteError(
                    f"trace file {self.trace_path} was removed while being written"
                )
        except Exception as exc:
            with self._lock:
                self._disable(exc)

    def close(self, error: BaseException | None = None, *, wait: bool | None = None) -> None:
        """Finish the trace: fetch outstanding measurements, write stages, close the file.

        Ray's events of the last tasks come about a second after them: unless
        ``wait`` (default: ``$TRACER_RAY_EVENTS_WAIT``, off), a thread waits
        for them, draws them and closes the file, and the run goes on at once
        with a complete trace that lacks only those (see
        :mod:`tracer.ray.finishing`; :func:`~tracer.ray.wait_for_traces`
        waits for them).
        """
        if self._closed:
            return
        self._flusher.stop(join=True)
        end_ts = self._close(error)
        self._closed = True
        if self._disabled:
            return
        self._disabled = True  # later calls do nothing, quietly: the trace is finished
        finish_trace(
            self.writer, self._lock, self._timeline, self._ray_events, end_ts, wait=wait
        )

    @guarded
    def _close(self, error: BaseException | None) -> int:
        """Everything but Ray's last events; returns the run's end time.

        After a ``ray.shutdown()`` nothing is asked of Ray (it would start a new
        cluster, see tracer.ray.connection): what was not read by then is
        recorded as lost, and said once here.
        """
        if not ray_connected():
            logger.warning(
                "tracer: Ray was %s when the trace of execution %s was closed; "
                "measurements not read by then are recorded as lost in %s",
                "shut down" if self._ray_at_start else "not running",
                self.execution_id, self.trace_path,
            )
        self._complete_received()
        self._drain_metrics()
        if self._returns.cancelled:
            self._poll_cancelled(CLOSE_GRACE_S)
        now = self.writer.now()
        for task in list(self._tasks.values()):
            # Never received: unfinished, its measurements not lost but not yet there.
            if self._actor is not None:
                self._actor.tasks.pop(task.task_id, None)
            task.metrics_ref = task.ray_task = None
            self._finish_task(task, now, {L.ARG_STATUS: L.STATUS_UNFINISHED})
        self._tasks.clear()
        if self._actor is not None:
            self._actor.await_stragglers()
        self._returns.lose_pending("measurements did not arrive before the close")
        self._returns.cancelled.clear()
        if self._actor is not None:
            self._actor.cancelled_tasks.clear()
        self._failures.clear()
        self._unreported.clear()
        self._timeline.finish()
        end_ts = self.writer.now()
        self._timeline.end_run(end_ts, error_args(error) if error is not None else None)
        return end_ts

"""The return channel, driver side: measurements read from each traced task's last return.

A traced call (:class:`~tracer.ray.RayFunctionWrapper`) returns its task's
measurements as one extra, small return value (see
:mod:`tracer.ray.task_metrics` for why). The runner tracer reads them when
the runner receives the task: many at a time with one ``ray.get`` (Ray has
already inlined these small values into the driver, so no data moves), once
per batch of received tasks. That read waits for nothing (``timeout=0``): a
task the runner reported received before it finished (its measurements are
not there yet) is not waited for but kept (:attr:`ReturnChannel.unfinished`,
one warning per execution), its task slice ending where it was received and
marked ``received_unfinished``, and its execution is drawn once it finished
(polled at wave ends and flushes; the close waits for it, bounded). A task's
failure carries its measurements in its error instead; a cancelled task's
come back only if it was running and stopped gracefully (polled, never
waited for, until the close).

Only the close waits, and for a bounded time: measurements that do not come
are recorded as lost, never waited for by the run.

Level 1 may instead take its executions from Ray's own task events
(``TRACER_EXECUTIONS=ray_events``: :mod:`tracer.ray.timeline.awaited`,
with the RSS in a profile event of the task's, see
:func:`tracer.ray.task_metrics.run_reported_to_ray`): no extra return value
at all, most of level 1's cost on small tasks (benchmarks/README.md). This
channel stays the default because what it brings at once, Ray's events
bring a second or more later and not to the runner: the tracer finds failed
tasks in it (and returns them from ``tasks_received_as_ready``), with the
attempts Ray made and the task an input failure came from; level 2's memray
figures and failed attempts' measurements come only this way.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from tracer.format import Track
from tracer.ray import layout as L
from tracer.ray.connection import RAY_SHUT_DOWN, ray_connected
from tracer.ray.runner_task import RunnerTask
from tracer.ray.task_errors import error_args, metrics_from_error, where_from_error
from tracer.ray.task_metrics import Metrics, unpack_metrics
from tracer.ray.timeline import RunTimeline

__all__ = ["ReturnChannel", "measured_itself", "ray_task_id"]

logger = logging.getLogger("tracer")

#: Measurements of received tasks are small values already in the driver (~ms):
#: the most a read of ready ones may take, and what the close waits for the rest.
METRICS_TIMEOUT_S = 10.0
#: How long a failed task's measurements return is waited for, to be read
#: once (see ReturnChannel.drop): it arrives with the task's result.
_DROP_WAIT_S = 0.5
#: How far a task's end may pass its receipt before it counts as received unfinished:
#: the clocks of a worker's node and the driver's may differ by this much.
CLOCK_SLACK_NS = 2_000_000
#: Measurements that could not be read with their batch, drained when this many wait.
_MAX_PENDING = 512
#: How long a read that found a measurement missing waits for it before calling its task
#: unfinished: a task's returns reach the driver in one reply but are stored one after
#: the other, the measurements (its last) after the result that woke the runner, so a
#: runner quick to report it may read a moment too early. Never waited for otherwise.
_SETTLE_S = 0.005
#: What a read gives for a ref whose task has not finished (see _get_ready).
_NOT_READY = object()

#: Where a cancelled task that was running stopped: (track, ts, mark args).
CancelMark = tuple[Track, int, dict[str, Any]]


class ReturnChannel:
    """Reads measurements from tasks' return values; writes their executions, or their loss."""

    def __init__(self, timeline: RunTimeline) -> None:
        self.timeline = timeline
        #: Received tasks whose measurements their batch could not read.
        self.pending: list[RunnerTask] = []
        #: Received tasks that had not finished when their measurements were read (the
        #: runner reported them too early), with their ref: read once they are there.
        self.unfinished: list[tuple[RunnerTask, Any]] = []
        #: Cancelled tasks whose measurements may still come back, with their ref.
        self.cancelled: list[tuple[RunnerTask, Any]] = []
        #: Set by the close: from then on :meth:`drain` waits (bounded) for what is unfinished.
        self.closing = False
        self._warned = False  # about a task received unfinished: once per execution

    def fetch(self, tasks: list[RunnerTask]) -> dict[str, BaseException]:
        """One round trip for many measurements; sets ``task.metrics``, returns the errors.

        Nothing is waited for: a task whose measurements are not there yet has
        not finished (the runner reported it received too early); it moves to
        :attr:`unfinished` (its ``metrics_ref`` there, None on the task). Ray
        shut down: nothing is asked (it would start a new cluster); the tasks
        stay unmeasured, and :meth:`drain` records them as lost.
        """
        if not ray_connected():
            return {}
        import ray

        refs = [t.metrics_ref for t in tasks]
        try:
            values = ray.get(refs, timeout=0)  # all there: the normal case, one round trip
        except Exception:  # one not there yet, or one failed: sort them out (rare)
            return self._fetch_each(tasks, refs)
        errors: dict[str, BaseException] = {}
        for task, value in zip(tasks, values, strict=True):
            if isinstance(value, BaseException):
                errors[task.task_id] = value
            else:
                task.metrics = unpack_metrics(value)
        return errors

    def _fetch_each(self, tasks: list[RunnerTask], refs: list[Any]) -> dict[str, BaseException]:
        """:meth:`fetch` of a batch one of whose measurements failed or is not there yet."""
        errors: dict[str, BaseException] = {}
        for task, value in zip(tasks, _get_ready(refs), strict=True):
            if value is _NOT_READY:
                self._keep_unfinished(task)
            elif isinstance(value, BaseException):
                errors[task.task_id] = value
            else:
                task.metrics = unpack_metrics(value)
        return errors

    def _keep_unfinished(self, task: RunnerTask) -> None:
        """A received task that has not finished: read once it has (warned once)."""
        self.unfinished.append((task, task.metrics_ref))
        task.metrics_ref = None
        self.say_received_unfinished(task)

    def finished_after_received(self, task: RunnerTask) -> bool:
        """Whether a task whose measurements are read ended after the runner received it
        (by more than the clocks of two nodes may differ): it was received unfinished,
        and finished by the time its batch was read. Warned as :meth:`_keep_unfinished`."""
        m = task.metrics
        if m is None or int(m.get("end_ns") or 0) <= task.received_ts + CLOCK_SLACK_NS:
            return False
        self.say_received_unfinished(task)
        return True

    def say_received_unfinished(self, task: RunnerTask) -> None:
        """One warning per execution: the runner reported a task received before it ended."""
        if self._warned:
            return
        self._warned = True
        logger.warning(
            "tracer: task %s of execution %s was reported received (task_received_as_ready) "
            "before it finished; the tracer does not wait for it: its task slice ends where it "
            "was received, marked %s, its execution is drawn where it ran, and the latency "
            "analysis gives it no pickup. Further such tasks of this execution are not "
            "warned about.",
            task.task_id, self.timeline.execution_id, L.ARG_RECEIVED_UNFINISHED,
        )

    def queue(self, task: RunnerTask) -> bool:
        """Keep a received task's measurements for :meth:`drain`; True when it is time to."""
        self.pending.append(task)
        return len(self.pending) >= _MAX_PENDING

    def drain(self) -> None:
        """Read what the batches could not, and what is there now of the unfinished; write
        each. Waits only once :attr:`closing` (up to ``METRICS_TIMEOUT_S``): what is not
        there is kept in :attr:`unfinished` (at the close, for :meth:`lose_pending`)."""
        for task in self.pending:
            self.unfinished.append((task, task.metrics_ref))
            task.metrics_ref = None
        self.pending.clear()
        self.poll_unfinished(METRICS_TIMEOUT_S if self.closing else 0)

    def poll_unfinished(self, timeout: float = 0) -> None:
        """Write the executions of the :attr:`unfinished` tasks whose measurements are
        there (waiting up to ``timeout``); keep the others. One ``ray.wait`` for all."""
        waiting, self.unfinished = self.unfinished, []
        if not waiting:
            return
        timeline = self.timeline
        if not ray_connected():
            for task, _ in waiting:
                timeline.lost(task.task_id, RAY_SHUT_DOWN)
            return
        import ray

        refs = [ref for _, ref in waiting]
        try:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout, fetch_local=False)
        except Exception:
            ready = []  # Ray cannot tell now: asked again later (at the close: lost)
        done = set(ready)
        for task, ref in waiting:
            if ref in done:
                self._write(task, ref)
            else:
                self.unfinished.append((task, ref))

    def _write(self, task: RunnerTask, ref: Any) -> None:
        """The execution of a received task whose measurements ``ref`` is ready, or its loss."""
        import ray

        timeline = self.timeline
        try:
            metrics = unpack_metrics(ray.get(ref, timeout=METRICS_TIMEOUT_S))
        except Exception as exc:  # the task failed: its error carries them
            metrics = metrics_from_error(exc)
            if metrics is None:
                timeline.lost(task.task_id, f"{type(exc).__name__}")
                return
            if not measured_itself(metrics, task.task_id, ref):
                return  # never ran: an upstream task failed (these are its measurements)
        if metrics is None:
            timeline.lost(task.task_id, "measurements unreadable")
            return
        timeline.execution(metrics, task)

    def lose_pending(self, why: str) -> None:
        """At the close: what is still pending never arrived; what is unfinished, never finished."""
        for task in self.pending:
            self.timeline.lost(task.task_id, why)
        self.pending.clear()
        for task, _ in self.unfinished:
            self.timeline.lost(task.task_id, "the task had not finished by the close")
        self.unfinished.clear()

    @staticmethod
    def drop(task: RunnerTask) -> None:
        """Forget a failed task's measurements return, read once it is there.

        It holds the task's error, like the result the runner already read:
        dropped unread, Ray logs it as an "Unhandled error" that the runner
        did handle. A task's return values come in one reply, but the driver
        stores them one by one: the runner may see the result's error a few
        µs before this one is there, so it is waited for, briefly
        (``_DROP_WAIT_S``). Not there by then (a task the runner reports
        failed while it still runs): left alone.
        """
        ref, task.metrics_ref = task.metrics_ref, None
        if ref is None or not ray_connected():
            return
        import ray

        with contextlib.suppress(Exception):
            ray.get(ref, timeout=_DROP_WAIT_S)

    def poll_cancelled(
        self, timeout: float, on_running: Callable[[str, CancelMark], None]
    ) -> None:
        """Write the executions of cancelled tasks whose outcome is known (wait ``timeout``).

        A task that was running and whose error names only where it stopped
        is handed to ``on_running`` with the mark to make there (the runner
        tracer holds it while a metrics actor may still bring the execution).
        Once Ray was shut down nothing more will be known: they are forgotten
        (their task slices say they were cancelled).
        """
        pending, self.cancelled = self.cancelled, []
        if not ray_connected():
            return
        import ray

        refs = [ref for _, ref in pending]
        try:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        except Exception:
            return  # Ray cannot tell: nothing more will be known
        done = set(ready)
        timeline = self.timeline
        for task, ref in pending:
            if ref not in done:
                if not timeout:
                    self.cancelled.append((task, ref))
                continue  # at close: still stopping; the task slice says it was cancelled
            try:
                metrics = unpack_metrics(ray.get(ref, timeout=METRICS_TIMEOUT_S))
            except Exception as exc:
                metrics = metrics_from_error(exc)
                if metrics is None:
                    node_id, pid = where_from_error(exc)
                    if pid:  # it was running: mark the worker where it stopped
                        on_running(task.task_id, (
                            timeline.locate(node_id, pid), timeline.writer.now(),
                            {L.ARG_TASK_ID: task.task_id, **error_args(exc)},
                        ))
                    continue
                if not measured_itself(metrics, task.task_id, ref):
                    continue  # never ran: these are an upstream task's
            if isinstance(metrics, dict):
                timeline.execution(metrics, task)


def ray_task_id(ref: Any) -> str:
    """Ray's id (hex) of the task that returns ``ref``, or of ``ref`` if it is a TaskID
    ("" if it cannot tell)."""
    try:
        task_id = ref.task_id() if hasattr(ref, "task_id") else ref
        return str(task_id.hex())
    except Exception:
        return ""


def measured_itself(metrics: Metrics, task_id: str, ref: Any) -> bool:
    """Whether ``metrics``, found in the return or error of task ``task_id``, are its own.

    A task whose input failed never runs: Ray hands it the upstream task's
    error, measurements included. Self-measuring tasks name their task; a
    traced call's measurements name Ray's task id, and ``ref`` (one of the
    task's return values) says which task it was.
    """
    if metrics.get("task_id") is not None:
        return str(metrics["task_id"]) == task_id
    ray_id = metrics.get("ray_task_id")
    if not ray_id or ref is None:
        return True  # nothing says otherwise
    own = ray_task_id(ref)
    return not own or own == ray_id


def _get_ready(refs: list[Any]) -> list[Any]:
    """Each ref's value, its error, or ``_NOT_READY`` if its task has not finished: one
    ``ray.wait`` that waits no more than ``_SETTLE_S``, then one ``ray.get`` of the ready
    ones (one by one if one of them failed). Ray unable to tell: None for each
    (unreadable, for now)."""
    import ray

    try:
        # Ready: its task finished (a value not in this node yet is read, not waited for).
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_SETTLE_S, fetch_local=False)
    except Exception:
        return [None] * len(refs)
    got: dict[Any, Any] = {}
    if ready:
        try:
            got = dict(zip(ready, ray.get(ready, timeout=METRICS_TIMEOUT_S), strict=True))
        except Exception:  # one failed
            for ref in ready:
                try:
                    got[ref] = ray.get(ref, timeout=METRICS_TIMEOUT_S)  # ready: at once
                except ray.exceptions.GetTimeoutError:
                    pass
                except Exception as exc:
                    got[ref] = exc
    return [got.get(ref, _NOT_READY) for ref in refs]

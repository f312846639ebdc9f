"""The return channel, driver side: measurements read from each traced task's last return.

A traced call (:class:`~tracer.ray.RayFunctionWrapper`) returns its task's
measurements as one extra, small return value (see
:mod:`tracer.ray.task_metrics` for why). The runner tracer reads them when
the runner receives the task: many at a time with one ``ray.get`` (Ray has
already inlined these small values into the driver, so no data moves), once
per batch of received tasks. What that read could not get is kept
(:attr:`ReturnChannel.pending`) and read again at the end of the wave; a
task's failure carries them in its error instead; a cancelled task's come
back only if it was running and stopped gracefully (polled, never waited
for, until the close).

Every wait has a timeout: measurements that do not come are recorded as
lost, never waited for by the run.

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

#: Measurements of received tasks are small values already in the driver (~ms).
METRICS_TIMEOUT_S = 10.0
#: How long a failed task's measurements return is waited for, to be read
#: once (see ReturnChannel.drop): it arrives with the task's result.
_DROP_WAIT_S = 0.5
#: Measurements that could not be read with their batch, drained when this many wait.
_MAX_PENDING = 512

#: Where a cancelled task that was running stopped: (track, ts, mark args).
CancelMark = tuple[Track, int, dict[str, Any]]


class ReturnChannel:
    """Reads measurements from tasks' return values; writes their executions, or their loss."""

    def __init__(self, timeline: RunTimeline) -> None:
        self.timeline = timeline
        #: Received tasks whose measurements their batch could not read.
        self.pending: list[RunnerTask] = []
        #: Cancelled tasks whose measurements may still come back, with their ref.
        self.cancelled: list[tuple[RunnerTask, Any]] = []

    def fetch(self, tasks: list[RunnerTask]) -> dict[str, BaseException]:
        """One round trip for many measurements; sets ``task.metrics``, returns the errors.

        Ray shut down: nothing is asked (it would start a new cluster); the
        tasks stay unmeasured, and :meth:`drain` records them as lost.
        """
        if not ray_connected():
            return {}
        import ray

        refs = [t.metrics_ref for t in tasks]
        values: list[Any]
        try:
            values = ray.get(refs, timeout=METRICS_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            return {}  # left for the wave's drain
        except Exception:  # at least one failed: sort them out one by one (rare)
            values = _get_each(refs)
        errors: dict[str, BaseException] = {}
        for task, value in zip(tasks, values, strict=True):
            if isinstance(value, BaseException):
                errors[task.task_id] = value
            else:
                task.metrics = unpack_metrics(value)
        return errors

    def queue(self, task: RunnerTask) -> bool:
        """Keep a received task's measurements for :meth:`drain`; True when it is time to."""
        self.pending.append(task)
        return len(self.pending) >= _MAX_PENDING

    def drain(self) -> None:
        """Read what the batches could not (waiting up to the timeout); write or lose each."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        timeline = self.timeline
        if not ray_connected():
            for task in pending:
                timeline.lost(task.task_id, RAY_SHUT_DOWN)
            return
        import ray

        refs = [t.metrics_ref for t in pending]
        try:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=METRICS_TIMEOUT_S)
        except Exception:
            ready = []
        ready_set = set(ready)
        for task in pending:
            if task.metrics_ref not in ready_set:
                timeline.lost(task.task_id, "measurements did not arrive in time")
                continue
            try:
                metrics = unpack_metrics(ray.get(task.metrics_ref, timeout=METRICS_TIMEOUT_S))
            except Exception as exc:  # the task failed: its error carries them
                metrics = metrics_from_error(exc)
                if metrics is None:
                    timeline.lost(task.task_id, f"{type(exc).__name__}")
                    continue
                if not measured_itself(metrics, task.task_id, task.metrics_ref):
                    continue  # never ran: an upstream task failed (these are its measurements)
            if metrics is None:
                timeline.lost(task.task_id, "measurements unreadable")
                continue
            timeline.execution(metrics, task)

    def lose_pending(self, why: str) -> None:
        """At the close: what is still pending never arrived."""
        for task in self.pending:
            self.timeline.lost(task.task_id, why)
        self.pending.clear()

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


def _get_each(refs: list[Any]) -> list[Any]:
    """Each ref's value, its error, or None if not ready within the timeout (one wait in all)."""
    import ray

    try:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=METRICS_TIMEOUT_S)
    except Exception:
        ready = []
    done = set(ready)
    values: list[Any] = []
    for ref in refs:
        if ref not in done:
            values.append(None)
            continue
        try:
            values.append(ray.get(ref, timeout=METRICS_TIMEOUT_S))  # ready: returns at once
        except ray.exceptions.GetTimeoutError:
            values.append(None)
        except Exception as exc:
            values.append(exc)
    return values

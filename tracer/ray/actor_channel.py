"""The metrics actor, driver side: draining it, and what is lost when it fails.

Tasks that measure themselves (:func:`tracer.ray.collect_ray_task_metrics`,
the Daft pattern) and traced tasks' failed attempts report to the
execution's actor (:mod:`tracer.ray.metrics_actor`). The driver drains it at
the end of each wave, never waiting for it to start (its process takes 1-2
s; tasks' reports queue meanwhile): only reports known to be coming (a
retried task's earlier attempts, the stragglers at the close) are waited
for, up to a timeout. After its first failure the actor is not called again,
and the tasks whose measurements it held or would have received are
recorded as lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from tracer.ray import layout as L
from tracer.ray.connection import RAY_SHUT_DOWN, ray_connected
from tracer.ray.failures import Failures
from tracer.ray.return_channel import CancelMark
from tracer.ray.runner_task import RunnerTask
from tracer.ray.task_metrics import Metrics
from tracer.ray.timeline import RunTimeline

__all__ = ["ActorChannel"]

logger = logging.getLogger("tracer")

#: One call of the metrics actor is ~1 ms; after its first failure it is not called again.
ACTOR_TIMEOUT_S = 5.0
#: How long the metrics actor may take to start (a new worker process, ~1-2 s;
#: the run does not wait for it, only the close does, for what it holds).
ACTOR_START_TIMEOUT_S = 30.0
#: At close, how long to wait for measurements still on their way through the
#: actor (a task's fire-and-forget call may land after the runner received its
#: result), and of cancelled tasks.
CLOSE_GRACE_S = 1.0
#: Cancelled tasks remembered for the execution the actor may still bring.
_MAX_CANCELLED = 100_000


class ActorChannel:
    """The execution's metrics actor as the driver sees it.

    ``known_task(task_id)`` is the runner's task of that id while it is not
    completed (a failed attempt may report before or after its receipt).

    Created for every execution that has (or had) an actor: once the actor
    is gone (:attr:`lost_reason`), it still counts what is lost with it.
    """

    def __init__(
        self,
        actor: Any,
        timeline: RunTimeline,
        failures: Failures,
        known_task: Callable[[str], RunnerTask | None],
    ) -> None:
        self.actor = actor
        self.timeline = timeline
        self._failures = failures
        self._known_task = known_task
        # The actor's ``ready`` call until it answered: it may still be starting, and
        # the dispatch loop never waits for that (see is_ready).
        self._ready_ref: Any = actor.ready.remote()
        self._started_at = time.monotonic()
        #: Why the actor is gone (None while it answers).
        self.lost_reason: str | None = None
        #: Tasks whose measurements may come through the actor, by id (for their arrow).
        self.tasks: dict[str, RunnerTask] = {}
        #: Marks of cancelled tasks that were running, held while the actor may still bring
        #: their measurements (then their execution says it all).
        self.cancelled_running: dict[str, CancelMark] = {}
        #: Cancelled tasks by id, for the execution the actor may still bring.
        self.cancelled_tasks: dict[str, RunnerTask] = {}

    @property
    def alive(self) -> bool:
        return self.actor is not None

    def cancelled(self, task: RunnerTask) -> None:
        """The runner cancelled ``task``: a running attempt may still report through the actor."""
        self.tasks.pop(task.task_id, None)
        if len(self.cancelled_tasks) >= _MAX_CANCELLED:
            self.cancelled_tasks.clear()
        self.cancelled_tasks[task.task_id] = task

    def received(self, task: RunnerTask) -> None:
        """A task measured through the actor was received: if the actor is gone, so are they."""
        if self.lost_reason is not None and self.tasks.pop(task.task_id, None) is not None:
            self.timeline.lost(task.task_id, self.lost_reason)

    def is_ready(self, wait: bool) -> bool:
        """Whether the actor is up; ``wait`` for it (until its start timeout).

        False while it starts (it holds nothing then: tasks' calls queue in
        their workers) or when it failed to start (then it is gone).
        """
        ref = self._ready_ref
        if ref is None:
            return True
        import ray

        timeout = (
            max(0.0, self._started_at + ACTOR_START_TIMEOUT_S - time.monotonic())
            if wait else 0.0
        )
        ready, _ = ray.wait([ref], timeout=timeout)
        if not ready:
            if wait or time.monotonic() - self._started_at >= ACTOR_START_TIMEOUT_S:
                self.gone(f"metrics actor did not start within {ACTOR_START_TIMEOUT_S:g} s")
            return False
        try:
            ray.get(ref, timeout=ACTOR_TIMEOUT_S)
        except Exception as exc:
            self.gone(f"metrics actor failed to start ({type(exc).__name__})")
            return False
        self._ready_ref = None
        return True

    def drain(self, wait: bool = False) -> bool:
        """Deliver what the actor holds; False if there is no actor (any more).

        While the actor starts there is nothing to drain: this returns at once
        unless ``wait`` (for reports known to be coming).
        """
        actor = self.actor
        if actor is None:
            return False
        if not ray_connected():
            # Calling it would start a new cluster; the close says why (one warning).
            self.gone(RAY_SHUT_DOWN, warn=False)
            return False
        if not self.is_ready(wait):
            return self.actor is not None
        import ray

        try:
            items = ray.get(actor.drain.remote(), timeout=ACTOR_TIMEOUT_S)
        except Exception as exc:
            self.gone(f"metrics actor unreachable ({type(exc).__name__})")
            return False
        for metrics in items:
            if isinstance(metrics, dict):
                self._deliver(metrics)
        return True

    def _deliver(self, metrics: Metrics) -> None:
        """One report: a task's execution, a cancelled task's, or a failed attempt's."""
        task_id = str(metrics.get("task_id"))
        self.cancelled_running.pop(task_id, None)
        failures = self._failures
        cancelled = self.cancelled_tasks.pop(task_id, None)
        if cancelled is not None:  # it was running when cancelled: this is how it ended
            if failures.new_attempt(task_id, metrics):
                self.timeline.execution(metrics, cancelled)
            return
        if metrics.get("error_type"):
            if not failures.new_attempt(task_id, metrics):
                return  # already written from the task's error
            task = self.tasks.get(task_id)
            if task is None or not task.released:
                # A failed attempt of a task still in flight: Ray may retry it.
                failures.measured_attempt(task_id, int(metrics.get("attempt") or 0))
                self.timeline.execution(metrics, self._known_task(task_id))
                return
        self.timeline.execution(metrics, self.tasks.pop(task_id, None))

    def gone(self, reason: str, *, warn: bool = True) -> None:
        """The actor failed: never call it again; what it held is lost.

        ``warn=False``: the caller says it (Ray shut down: the tracer's close warns once).
        """
        self.actor = None
        self.lost_reason = reason
        timeline = self.timeline
        if warn:
            logger.warning(
                "tracer: %s for execution %s; measurements of tasks reporting through it are "
                "lost (recorded in the trace); the run and the rest of its trace go on",
                reason, timeline.execution_id,
            )
        timeline.loop_instant(L.INSTANT_METRICS_ACTOR_LOST, {L.ARG_REASON: reason})
        for task_id, task in list(self.tasks.items()):
            if task.released:  # received: its measurements were in the actor, or on their way
                del self.tasks[task_id]
                timeline.lost(task_id, reason)
        self.mark_cancelled_running()

    def mark_cancelled_running(self) -> None:
        """Mark where the cancelled tasks stopped that the actor did not bring."""
        for track, ts, args in self.cancelled_running.values():
            self.timeline.mark(track, L.INSTANT_TASK_CANCELLED, ts, args)
        self.cancelled_running.clear()

    def await_stragglers(self) -> None:
        """At close: measurements of received tasks may still be on their way to the actor."""

        def awaited() -> bool:
            return bool(self.cancelled_running) or any(t.released for t in self.tasks.values())

        if awaited():
            self.drain(wait=True)  # it may still be starting: what it will hold counts
        deadline = time.monotonic() + CLOSE_GRACE_S
        while awaited():
            if time.monotonic() >= deadline or not self.drain():
                break
            time.sleep(0.02)
        for task_id, task in list(self.tasks.items()):
            if task.released:
                self.timeline.lost(
                    task_id, self.lost_reason or "measurements did not arrive before the close"
                )
        self.tasks.clear()
        self.mark_cancelled_running()

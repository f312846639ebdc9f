"""What a failed task was: its own failure, or its input's, and where it happened.

The runner reports a task whose result is an error (:meth:`RunnerTracer.task_failed`,
or a failure found while completing received tasks). From the error this
module tells:

* **its own failure or its input's**: a task whose input is a failed task's
  result never runs; Ray hands it the same error, which carries the
  upstream task's measurements, or (an OOM kill, a crash, a lost node)
  wraps the upstream task's error around the very same message. Such a
  task is ``failed upstream``, with no execution and no mark on a worker.
  A task's own system error is not wrapped: two tasks lost with the same
  node get the same message, and neither is the other's upstream;
* **where it ran**: from the measurements its error carries (then its
  execution is written) or the node and worker Ray's error names (then a
  mark is made there; a crashed worker's error names none: the mark goes on
  the dispatch loop);
* **its attempts**: Ray retries crashed attempts (``max_retries``) and,
  with ``retry_exceptions``, attempts that raised, without telling the
  driver; measurements carry Ray's attempt number, and attempts reported
  through the metrics actor are remembered, so a task's slice says how many
  attempts it took and how many left no measurement. An attempt may be
  reported twice (through the actor and in its error): it is written once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tracer.ray import layout as L
from tracer.ray.return_channel import ReturnChannel, measured_itself, ray_task_id
from tracer.ray.runner_task import RunnerTask
from tracer.ray.task_errors import (
    error_args,
    kill_args,
    killed_workers,
    metrics_from_error,
    root_cause,
    top_memory_users,
    where_from_error,
)
from tracer.ray.task_metrics import Metrics
from tracer.ray.timeline import CANCEL_ERRORS, RunTimeline

__all__ = ["Failures"]

#: Failed attempts remembered so that one reported twice (through the actor
#: and in its error) is written once.
_MAX_FAILED_ATTEMPTS = 100_000
#: Failures remembered to recognise a downstream task's copy of their error.
_MAX_REMEMBERED = 10_000

Finish = Callable[[RunnerTask, int, "dict[str, Any] | None"], None]


class Failures:
    """Records failed tasks in the timeline; remembers what later failures are compared with.

    ``finish(task, ts, args)`` ends a task's slices (the runner tracer's);
    ``in_flight()`` lists the tasks whose measurements may name a failure
    reported in another task's error.
    """

    def __init__(
        self,
        timeline: RunTimeline,
        finish: Finish,
        in_flight: Callable[[], Iterable[RunnerTask]],
    ) -> None:
        self.timeline = timeline
        self._finish = finish
        self._in_flight = in_flight
        self._seen: dict[int, str] = {}  # hash of an error's text -> its task
        # Failed tasks by Ray's task id: measurements in a downstream task's error name only it.
        self._by_ray_task: dict[str, str] = {}
        # (task id, Ray attempt) of the executions written for failed attempts, and per
        # task in flight the attempts measured (through the actor) before its end.
        self._attempts_written: set[tuple[str, int]] = set()
        self._measured: dict[str, set[int]] = {}

    def record(
        self, task_id: str, error: BaseException, now: int, task: RunnerTask | None
    ) -> None:
        """``task`` (None: not in flight any more) ended with ``error`` at ``now``."""
        err: dict[str, Any] = dict(error_args(error))
        status = L.STATUS_CANCELLED if err[L.ARG_ERROR_TYPE] in CANCEL_ERRORS else L.STATUS_FAILED
        metrics = metrics_from_error(error)
        cause = root_cause(error)
        text_key = hash(str(cause))
        upstream = self._seen.get(text_key) if cause is not error else None
        if metrics is not None:
            own = (
                measured_itself(
                    metrics, task.task_id,
                    task.metrics_ref if task.metrics_ref is not None else task.ray_task,
                )
                if task is not None
                else str(metrics.get("task_id", task_id)) == str(task_id)
            )
            upstream = None if own else self.measured_task(metrics)
        if upstream is not None and upstream != task_id:
            if task is not None:
                ReturnChannel.drop(task)
                task.metrics = None
                self._finish(
                    task, now, {L.ARG_STATUS: L.STATUS_FAILED_UPSTREAM,
                                L.ARG_UPSTREAM_TASK_ID: upstream, **err},
                )
            self._measured.pop(task_id, None)
            return
        # Ray's id of a task with no measurements (its worker killed, crashed or lost):
        # its states say whether and when it ran. Taken before its refs are dropped.
        ray_id = ""
        if metrics is None and task is not None:
            ray_id = ray_task_id(
                task.metrics_ref if task.metrics_ref is not None else task.ray_task
            )
        if len(self._seen) < _MAX_REMEMBERED:
            self._seen[text_key] = task_id
        if metrics is not None and metrics.get("ray_task_id") and (
            len(self._by_ray_task) < _MAX_REMEMBERED
        ):
            self._by_ray_task[str(metrics["ray_task_id"])] = str(task_id)
        where: dict[str, Any] = {}
        # Ray's name of the task: the reference runner's tasks are named after their
        # stage, so an OOM report of several workers says which one ran it.
        ray_name = self.timeline.stage_name(task) if task is not None else None
        node_id, pid = (None, 0) if metrics is not None else where_from_error(error, ray_name)
        if node_id:
            where[L.ARG_NODE_ID] = node_id
        if pid:
            where[L.ARG_WORKER_PID] = pid
        memory: dict[str, Any] = {}
        if task is not None:
            memory[L.ARG_MEMORY_REQUESTED] = int(task.request.memory_bytes or 0)
        memory.update(kill_args(error, ray_name))
        killed = killed_workers(error) if metrics is None else {}
        attempts: dict[str, Any] = {}
        if metrics is not None and metrics.get("attempt"):
            attempts = self.attempt_args(task_id, metrics)
        if task is not None:
            ReturnChannel.drop(task)
            task.metrics = None
            self._finish(task, now, {L.ARG_STATUS: status, **err, **where, **memory, **attempts})
        self._measured.pop(task_id, None)
        timeline = self.timeline
        if ray_id and task is not None:
            timeline.expect_ray_states(task, ray_id)
        if metrics is not None:
            metrics.setdefault("error_type", err[L.ARG_ERROR_TYPE])
            metrics.setdefault("error", err[L.ARG_ERROR])
            if self.new_attempt(task_id, metrics):
                timeline.execution(metrics, task)
            return
        if killed:
            timeline.workers_killed(node_id, killed, now)
            if task is not None:
                timeline.task_killed(task, node_id, now, memory.get(L.ARG_MEMORY_AT_KILL))
        track = timeline.locate(node_id, pid) if node_id or pid else timeline.loop
        name = L.INSTANT_TASK_CANCELLED if status == L.STATUS_CANCELLED else L.INSTANT_TASK_FAILED
        mark: dict[str, Any] = {L.ARG_TASK_ID: str(task_id), **err, **memory}
        top = top_memory_users(error)
        if top:
            mark[L.ARG_OOM_TOP_MEMORY_USERS] = top
        timeline.mark(track, name, now, mark)

    def measured_task(self, metrics: Metrics) -> str:
        """The runner's id of the task that took ``metrics`` (found in another task's error).

        Self-measuring tasks name themselves; a traced call's measurements name
        only Ray's task id, which is looked up among the failed tasks and, for a
        failure received in the same batch or not yet, the tasks in flight.
        """
        if metrics.get("task_id") is not None:
            return str(metrics["task_id"])
        ray_id = str(metrics.get("ray_task_id") or "")
        known = self._by_ray_task.get(ray_id)
        if known is not None:
            return known
        for task in self._in_flight():
            if task.metrics_ref is not None and ray_task_id(task.metrics_ref) == ray_id:
                return task.task_id
        return f"ray task {ray_id}" if ray_id else "?"

    def new_attempt(self, task_id: str, metrics: Metrics) -> bool:
        """Whether this failed attempt is seen for the first time (it may come twice:
        through the metrics actor and in the task's error)."""
        key = (task_id, int(metrics.get("attempt") or 0))
        if key in self._attempts_written:
            return False
        if len(self._attempts_written) >= _MAX_FAILED_ATTEMPTS:
            self._attempts_written.clear()
        self._attempts_written.add(key)
        return True

    def measured_attempt(self, task_id: str, attempt: int) -> None:
        """A failed attempt of a task still in flight was measured (through the actor)."""
        self._measured.setdefault(task_id, set()).add(attempt)

    def attempt_args(self, task_id: str, metrics: Metrics) -> dict[str, Any]:
        """A retried task's attempts: how many, and how many were never measured."""
        attempt = int(metrics.get("attempt") or 0)
        measured = self._measured.pop(task_id, set())
        return {
            L.ARG_RAY_ATTEMPTS: attempt + 1,
            L.ARG_UNMEASURED_ATTEMPTS: attempt - sum(1 for a in measured if a < attempt),
        }

    def forget(self, task_id: str) -> None:
        """The task will not end with its attempts counted (cancelled)."""
        self._measured.pop(task_id, None)

    def clear(self) -> None:
        self._measured.clear()

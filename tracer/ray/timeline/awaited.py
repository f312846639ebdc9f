"""Executions still to be drawn from Ray's own events (level 1 without a return channel).

At level 1 a traced task sends nothing back of its own: Ray's task events
say where (node, worker), when (its phases, and the span of the tracer's
profile event around the body, with the RSS in it) and how (attempts, the
error of a failed one) it ran. They reach the GCS about a second after the
task, so when the runner receives a task its execution is not known yet:
the task is *awaited* here, by Ray's task id, until a read of Ray's events
brings every attempt of it, settled.

What depends on an awaited execution waits with it: the memory counters
(no execution still to come may start before what they wrote), and the
summary of its stage (written when the stage's last execution is drawn).
Executions whose events never come (Ray's caps, a read that failed, the
close's budget spent) are counted (``executions_missing`` on the ``Ray's
events read`` instant); the task's own slice says it ran all the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from tracer.ray import layout as L
from tracer.ray.timeline.ray_phases import RayTaskEvents

if TYPE_CHECKING:
    from tracer.ray.timeline.run import Measurements, TimelineTask

__all__ = ["Awaited", "measurements"]

class Awaited:
    """Tasks received whose executions Ray's events will bring, by Ray's task id."""

    def __init__(self) -> None:
        self._by_ray_id: dict[str, TimelineTask] = {}
        #: The failure of a task as its producer read it, by Ray's task id (see add).
        self._errors: dict[str, tuple[str, str]] = {}
        self._by_stage: dict[Any, int] = {}
        #: Given up on at the end: their events never came.
        self.missing = 0

    def __len__(self) -> int:
        return len(self._by_ray_id)

    def add(
        self, task: TimelineTask, ray_task_id: str, error: tuple[str, str] | None = None
    ) -> None:
        """``error``: the task failed so (class name, message), as its producer read it.

        Its last attempt's execution then says that, if it failed in its worker:
        Ray's text of an error may be cut before the exception the body raised
        (Ray's events keep its last ~500 characters: a deep traceback or a long
        message runs past them), while the producer had the whole of it.
        """
        self._by_ray_id[ray_task_id] = task
        if error is not None:
            self._errors[ray_task_id] = error
        self._by_stage[task.stage_id] = self._by_stage.get(task.stage_id, 0) + 1

    def wanted(self) -> list[str]:
        return list(self._by_ray_id)

    def probes(self, limit: int) -> list[str]:
        """The ``limit`` tasks received last: once Ray has their events, it has the others'
        (each worker and the owner report theirs on a timer, in order)."""
        ids = list(self._by_ray_id)
        return ids[-limit:] if limit > 0 else []

    def waiting_in(self, stage_id: Any) -> int:
        """Executions of that stage still awaited."""
        return self._by_stage.get(stage_id, 0)

    def since(self) -> int | None:
        """The earliest dispatch among awaited tasks: no execution still to come started
        before it (None: nothing awaited)."""
        return min(
            (t.dispatch_ts for t in self._by_ray_id.values() if t.dispatch_ts is not None),
            default=None,
        )

    def settle(
        self, events: Iterable[RayTaskEvents], final: bool
    ) -> Iterator[tuple[TimelineTask, list[RayTaskEvents]]]:
        """Awaited tasks whose attempts are all in ``events``, with them (each task once).

        A task is settled when Ray recorded its last attempt's end and, if a
        worker ran that attempt and will report it, that worker's events too;
        ``final``: whatever there is settles it (counted missing when that
        has no execution). The task is no longer awaited once yielded.
        """
        groups: dict[str, list[RayTaskEvents]] = {}
        for ev in events:
            if ev.ray_task_id in self._by_ray_id:
                groups.setdefault(ev.ray_task_id, []).append(ev)
        for ray_task_id, attempts in groups.items():
            attempts.sort(key=lambda e: e.attempt)
            if not _settled(attempts[-1]):
                if not final:
                    continue
                if all(measurements(a) is None for a in attempts):
                    self.missing += 1  # what came says it ran, but not where nor when
            task = self._by_ray_id.pop(ray_task_id)
            self._by_stage[task.stage_id] -= 1
            error = self._errors.pop(ray_task_id, None)
            if error is not None and attempts[-1].failed_in_worker:
                error_type, message = error
                attempts[-1] = dataclasses.replace(
                    attempts[-1], error_type=error_type, error=message
                )
            yield task, attempts

    def settled_ids(self, events: Iterable[RayTaskEvents]) -> set[str]:
        """The awaited tasks that ``events`` would settle (see :meth:`settle`), drawing nothing."""
        last: dict[str, RayTaskEvents] = {}
        for ev in events:
            if ev.ray_task_id in self._by_ray_id:
                seen = last.get(ev.ray_task_id)
                if seen is None or ev.attempt >= seen.attempt:
                    last[ev.ray_task_id] = ev
        return {ray_task_id for ray_task_id, ev in last.items() if _settled(ev)}

    def give_up(self) -> list[TimelineTask]:
        """What is still awaited, never to come: counted missing, no longer awaited."""
        tasks = list(self._by_ray_id.values())
        self.missing += len(tasks)
        self._by_ray_id.clear()
        self._by_stage.clear()
        self._errors.clear()
        return tasks


def _settled(last: RayTaskEvents) -> bool:
    """Has Ray sent all it will of this attempt?

    The owner reports the states it sees (submitted to a worker, finished,
    failed), the worker its own (running) and its phases, each on a timer
    of its own: an attempt that finished is settled once its worker's phases
    are in. One that failed is too, or once it is clear that no worker will
    report it: it never reached one (cancelled, or its input failed), or its
    worker was killed (then its buffered events died with it).
    """
    if last.span is not None:
        return last.ended
    if last.failed_at is None:
        return False  # running, or finished with the worker's report still to come
    submitted = any(s == L.STATE_SUBMITTED for s, _ in last.states)
    return not submitted or not last.failed_in_worker


def measurements(ev: RayTaskEvents) -> Measurements | None:
    """One attempt's execution as the run timeline draws it, or None if it never ran a body.

    The span is the tracer's own profile event around the body (what the
    return channel's measurements timed), else Ray's ``execute`` phase, else
    Ray's whole handling of the task in its worker.
    """
    if ev.measured is not None:
        start, end = ev.measured
    else:
        execute = next((p for p in ev.phases if p[0] == L.PHASE_EXECUTE), None)
        if execute is not None:
            start, end = execute[1], execute[2]
        elif ev.span is not None:
            start, end = ev.span
        else:
            return None
    m: Measurements = {
        "start_ns": start,
        "end_ns": max(end, start),
        "node_id": ev.node_id,
        "pid": ev.worker_pid,
        "ray_task_id": ev.ray_task_id,
    }
    if ev.attempt:
        m["attempt"] = ev.attempt
    if ev.resources:
        m["assigned_resources"] = dict(ev.resources)
    if ev.rss is not None:
        m["rss_start"], m["rss_end"], m["rss_peak"] = ev.rss
    if ev.failed_at is not None or ev.error_type:  # Ray says a cancelled task finished
        m["error_type"] = ev.error_type or "failed"
        m["error"] = ev.error
    return m

"""Ray's own events of a task, drawn next to what the tracer measured.

Ray records, for every task attempt, its scheduling states (with the time
each began) and, in the worker that ran it, its phases (deserializing the
arguments, executing, storing the outputs). A producer
(:mod:`tracer.ray.ray_events`) reads them and hands them over as a
:class:`RayTaskEvents` fact, named by Ray's task id and attempt; this module
draws them where the run timeline drew that execution:

* the phases on a ``Ray phases`` track under the worker's track: a
  ``ray task <name>`` slice (Ray's whole handling of the task in the worker)
  with the phases nested in it. Not nested in the execution slice: Ray
  deserializes the arguments before the measured execution starts and stores
  the outputs after it ends, so they cannot nest in it;
* the scheduling states on ``Ray states`` lanes beside the tasks' lanes (one
  name: trace_processor and the UI merge them into one track, as they do the
  tasks' lanes), nested in a ``ray states <stage>`` slice that names the task
  and spans its ``dispatched`` slice; each state until the next (the last
  until the runner received the task), clamped into that span (a state Ray
  timed on another node's clock, or after the runner saw the task, can fall
  outside it). A lane of their own per task lane had put hundreds of rows
  under the merged tasks in the UI when hundreds of tasks were in flight;
  nested in the task's own lane, they would be written seconds behind the
  lane's later tasks, outside the reader's window.

A task that failed with no execution to draw (its worker killed by Ray's
OOM killer, crashed, or lost with its node) gets its states alone, those of
each of its attempts, one after another (:meth:`RayPhases.expect_states`): whether and when it
reached a worker and ran there before it failed.

Both are written late (Ray reports its events about a second after they
happen), at their true times. Which executions still wait for their events
is kept here (:meth:`RayPhases.expect`), so the producer knows what to ask Ray
for and the trace can say how many never came.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Optional

from tracer.format import TraceWriter, Track
from tracer.ray import layout as L
from tracer.ray.timeline.nodes import Nodes, Worker

if TYPE_CHECKING:
    from tracer.ray.timeline.run import TimelineTask

__all__ = ["FailedAttempt", "RayPhases", "RayTaskEvents"]


@dataclasses.dataclass(frozen=True, slots=True)
class RayTaskEvents:
    """What Ray recorded of one task attempt (plain facts; timestamps in ns, the trace clock).

    ``states``: Ray's scheduling states (``layout.STATE_*`` names) with the
    time each began, in time order. ``span``: Ray's whole handling of the task
    in its worker, None when the worker's events have not arrived; ``phases``:
    ``(layout.PHASE_*, start, end)`` within it. ``measured``: the span of
    the task's body as the tracer's own profile event timed it, with the
    RSS it reported (``rss``: start, end, peak), when the task reported to
    Ray (level 1's executions drawn from Ray's events). ``error_type`` and
    ``error``: why the attempt failed: the exception its body raised where
    the task or Ray's text of it names one, else Ray's error;
    ``failed_in_worker``: Ray says the attempt failed in its worker (the
    body raised, or it was cancelled there), which then reports its own
    events after the failure. ``resources``: what the task asked Ray for.
    Where Ray's OOM killer killed the attempt's worker, its report: ``oom_used``
    (the worker's memory then, in bytes; 0: not said), ``oom_killed`` (each
    worker it killed in that round: pid, bytes) and ``oom_top`` (the node's
    largest processes then: pid, bytes, command; largest first).
    """

    ray_task_id: str
    attempt: int
    name: str = ""
    node_id: str = ""
    worker_pid: int = 0
    states: tuple[tuple[str, int], ...] = ()
    span: tuple[int, int] | None = None
    phases: tuple[tuple[str, int, int], ...] = ()
    measured: tuple[int, int] | None = None
    rss: tuple[int, int, int] | None = None
    error_type: str = ""
    error: str = ""
    resources: tuple[tuple[str, float], ...] = ()
    failed_in_worker: bool = False
    oom_used: int = 0
    oom_killed: tuple[tuple[int, int], ...] = ()
    oom_top: tuple[tuple[int, int, str], ...] = ()

    @property
    def ended(self) -> bool:
        """Ray has recorded the attempt's end (FINISHED or FAILED)."""
        # Asked once per task read, by the thread that draws them: a loop, not any() over
        # a generator (~1 µs less a task).
        for state, _ in self.states:  # noqa: SIM110
            if state == L.STATE_FINISHED or state == L.STATE_FAILED:
                return True
        return False

    @property
    def failed_at(self) -> int | None:
        """When Ray recorded the attempt failed (None: it did not)."""
        return next((ts for s, ts in self.states if s == L.STATE_FAILED), None)

    @property
    def ran(self) -> bool:
        """A worker started the attempt (Ray recorded it running, or its phases)."""
        return self.span is not None or any(s == L.STATE_RUNNING for s, _ in self.states)


class _Expected:
    """An execution drawn, waiting for Ray's events of its attempt."""

    __slots__ = ("end", "name", "phases_drawn", "task", "task_id", "worker")

    def __init__(
        self, task: TimelineTask | None, task_id: str, worker: Worker, name: str, end: int
    ) -> None:
        self.task = task
        self.task_id = task_id
        self.worker = worker
        self.name = name
        self.end = end
        self.phases_drawn = False


#: How long the node counters wait for a task's failed attempts (Ray reports its events
#: about a second late; a read may take its budget).
_ATTEMPTS_WAIT_NS = 30_000_000_000

#: Called with an attempt that failed: the task (None: not known), its id, its stage's
#: name, Ray's events of the failed attempt, and whether it was the task's last (False:
#: Ray ran the task again; True: the task failed with it, and the producer said so).
FailedAttempt = Callable[[Optional["TimelineTask"], str, str, "RayTaskEvents", bool], None]


class RayPhases:
    """Draws :class:`RayTaskEvents` of the executions the timeline drew."""

    def __init__(self, writer: TraceWriter, nodes: Nodes, states_parent: Track) -> None:
        self.writer = writer
        self.nodes = nodes
        #: Where the states' lanes go: the tasks' root, beside (after) the tasks' lanes.
        self.states_parent = states_parent
        #: The states' lanes, a heap of (the end of the last states drawn on it, the
        #: order it was made in, its track).
        self._state_lanes: list[tuple[int, int, Track]] = []
        #: Off until a producer reads Ray's events: nothing is kept for them then.
        self.enabled = False
        self._expected: dict[tuple[str, int], _Expected] = {}
        #: Tasks that failed with no execution to draw (a worker killed, crashed or
        #: lost): only their states are wanted, the task and its stage's name by Ray's
        #: task id. They say whether and when it reached a worker and ran there.
        self._states_only: dict[str, tuple[TimelineTask, str]] = {}
        #: Events Ray said it dropped (its caps), as the producer last read them.
        self.dropped_by_ray = 0
        #: Told of each attempt that failed before a later attempt of its task (the
        #: timeline draws it: an OOM kill Ray retried was otherwise nowhere); each once.
        self.on_failed_attempt: FailedAttempt | None = None
        self._failed_told: set[tuple[str, int]] = set()
        #: Drawn executions of a retry (Ray's attempt > 0), by Ray's task id: where its
        #: failed attempts belong when their events come in a later read (bounded).
        self._retries: dict[str, _Expected] = {}
        #: Tasks whose failed attempts' events are still to come (a retry drawn, or a task
        #: failed with no execution), by Ray's task id: when the task was dispatched, the
        #: earliest their attempts can be drawn at (see :meth:`attempts_since`).
        self._attempts_due: dict[str, tuple[int, int]] = {}  # (dispatch, since when due)

    def expect(
        self, ray_task_id: str, attempt: int, task: TimelineTask | None, task_id: str,
        worker: Worker, name: str, end: int = 0,
    ) -> None:
        """An execution (that ended at ``end``) was drawn: its Ray events are wanted."""
        if self.enabled and ray_task_id:
            self._expected[(ray_task_id, attempt)] = _Expected(task, task_id, worker, name, end)
            if attempt and task is not None and task.dispatch_ts is not None:
                self._attempts_due[ray_task_id] = (task.dispatch_ts, self.writer.now())

    def expect_states(self, ray_task_id: str, task: TimelineTask, name: str) -> None:
        """``task`` (of the stage ``name``) failed with no execution drawn: its Ray states
        are wanted, those of its attempts (drawn once Ray recorded the last one's end)."""
        if self.enabled and ray_task_id:
            self._states_only[ray_task_id] = (task, name)
            if task.dispatch_ts is not None:
                self._attempts_due[ray_task_id] = (task.dispatch_ts, self.writer.now())

    def give_up_attempts(self) -> None:
        """Ray's events are read for the last time: nothing waits for failed attempts."""
        self._attempts_due.clear()

    def attempts_since(self, now: int) -> int | None:
        """The earliest dispatch of a task whose failed attempts may still be drawn (None:
        none): their node memory steps go there, so the node's counters wait for them.
        Not for longer than :data:`_ATTEMPTS_WAIT_NS` (Ray's events of a task may never
        come: its caps, a read that fails)."""
        due = self._attempts_due
        if not due:
            return None
        stale = [k for k, (_, since) in due.items() if now - since > _ATTEMPTS_WAIT_NS]
        for key in stale:
            del due[key]
        return min((dispatch for dispatch, _ in due.values()), default=None)

    def wanted(self) -> list[str]:
        """Ray task ids whose events are still wanted (each once, whatever its attempts)."""
        ids = dict.fromkeys([key[0] for key in self._expected])
        if self._states_only:
            ids.update(dict.fromkeys(self._states_only))
        return list(ids)

    def probes(self, limit: int) -> list[str]:
        """Per worker, the wanted execution that ended last (the ``limit`` latest of them).

        Each worker reports its events on a timer of its own, and the driver
        its tasks' end states on another: once the last execution of every
        worker has all its events, every earlier one has them too, so a few
        one-task queries tell when one read of everything would find it all.
        """
        last: dict[int, tuple[int, str]] = {}  # by worker: (end, Ray task id)
        for (ray_task_id, _), exp in self._expected.items():
            seen = last.get(id(exp.worker))
            if seen is None or exp.end >= seen[0]:
                last[id(exp.worker)] = (exp.end, ray_task_id)
        return [ray_task_id for _, ray_task_id in sorted(last.values(), reverse=True)[:limit]]

    def complete_ids(self, events: Iterable[RayTaskEvents]) -> set[str]:
        """Ray task ids among ``events`` whose expected attempts there are all complete
        (what :meth:`draw` would draw of them), drawing nothing."""
        ids: dict[str, bool] = {}
        for ev in events:
            if (ev.ray_task_id, ev.attempt) in self._expected:
                complete = ev.span is not None and ev.ended
                ids[ev.ray_task_id] = ids.get(ev.ray_task_id, True) and complete
        complete_ids = {ray_task_id for ray_task_id, complete in ids.items() if complete}
        if self._states_only:
            complete_ids.update(
                ray_task_id for ray_task_id, attempts in self._attempts(events).items()
                if attempts[-1].ended
            )
        return complete_ids

    @property
    def missing(self) -> int:
        """Executions whose Ray events have not been drawn (all of them, or the worker's
        part), and failed tasks whose states have not."""
        return len(self._expected) + len(self._states_only)

    def draw(self, events: Iterable[RayTaskEvents], final: bool = False) -> int:
        """Draw the events of expected executions; returns how many are complete now.

        An attempt's events are complete once Ray has both its end state and
        its worker's phases; before that nothing is drawn (they are asked for
        again), unless ``final``: then what there is is drawn, and the
        execution stays counted as missing if its phases never came. A failed
        task expected for its states alone (:meth:`expect_states`) is complete
        once its last attempt there has ended.
        """
        done = 0
        ordered = sorted(events, key=lambda e: e.span[0] if e.span else 0)
        if self._states_only:
            for ray_task_id, attempts in self._attempts(ordered).items():
                if attempts[-1].ended or final:
                    task, name = self._states_only.pop(ray_task_id)
                    self._attempts_due.pop(ray_task_id, None)
                    self.draw_attempts_states(task, name, attempts)
                    for ev in attempts[:-1]:  # those Ray ran it again after
                        self._failed_attempt(task, task.task_id, name, ev)
                    self._failed_attempt(task, task.task_id, name, attempts[-1], last=True)
                    done += 1
        failed: list[RayTaskEvents] | None = None  # attempts that failed, not expected
        earlier: dict[str, list[RayTaskEvents]] | None = None  # failed attempts, by task
        for ev in ordered:
            key = (ev.ray_task_id, ev.attempt)
            exp = self._expected.get(key)
            if exp is None:
                if ev.error_type:  # (set only where an attempt failed: rare, checked first)
                    if failed is None:
                        failed = []
                    failed.append(ev)
                continue
            complete = ev.span is not None and ev.ended
            if not complete and not final:
                continue
            if ev.span is not None and not exp.phases_drawn:
                self._phases(exp, ev)
                exp.phases_drawn = True
            if exp.task is not None:
                drawn = ev
                if ev.attempt and not exp.task.ray_states_drawn:
                    # A retry: its failed attempts' states first, on the same lane (the
                    # lane was blank while they ran).
                    if earlier is None:
                        earlier = {}
                        for other in ordered:
                            if other.error_type:
                                earlier.setdefault(other.ray_task_id, []).append(other)
                    before = sorted(
                        (e for e in earlier.get(ev.ray_task_id, ()) if e.attempt < ev.attempt),
                        key=lambda e: e.attempt)
                    if before:
                        drawn = dataclasses.replace(
                            ev, states=tuple(st for e in (*before, ev) for st in e.states))
                self._states(exp.task, exp.name, drawn)
            if ev.span is not None:
                del self._expected[key]
                done += 1
                if ev.attempt:
                    if len(self._retries) >= 10_000:
                        self._retries.clear()
                    self._retries[ev.ray_task_id] = exp
                    self._attempts_due.pop(ev.ray_task_id, None)
        if failed is not None:
            self._failed_before_retries(failed)
        return done

    def _failed_before_retries(self, failed: list[RayTaskEvents]) -> None:
        """Of attempts that failed, those of a task whose later attempt ran and was drawn
        (expected, or drawn now): told once each to :attr:`on_failed_attempt`."""
        expected = self._expected
        for ev in failed:
            exp = self._retries.get(ev.ray_task_id)
            if exp is None:  # the later attempt's own events still to come
                for later in range(ev.attempt + 1, ev.attempt + 4):
                    exp = expected.get((ev.ray_task_id, later))
                    if exp is not None:
                        break
            if exp is not None:
                self._failed_attempt(exp.task, exp.task_id, exp.name, ev)

    def _failed_attempt(
        self, task: TimelineTask | None, task_id: str, name: str, ev: RayTaskEvents,
        last: bool = False,
    ) -> None:
        key = (ev.ray_task_id, ev.attempt)
        if ev.failed_at is None or key in self._failed_told or self.on_failed_attempt is None:
            return
        if len(self._failed_told) >= 100_000:
            self._failed_told.clear()
        self._failed_told.add(key)
        self.on_failed_attempt(task, task_id, name, ev, last)

    def _phases(self, exp: _Expected, ev: RayTaskEvents) -> None:
        # Drawn for every task, by the thread that reads Ray's events: the clamps are
        # spelled out (min()/max() calls were a fifth of this drawing's CPU).
        assert ev.span is not None
        start, end = ev.span
        if end < start:
            end = start
        w = self.writer
        begin, finish = w.begin, w.end
        track = self.nodes.ray_phases_track(exp.worker, start, end)
        # Ray's task id is on the execution beside it (and on the execution alone when
        # Ray's events never come): a second copy here, 48 hex digits that zlib cannot
        # shrink, was ~5% of a level-1 trace.
        args: dict[str, object] = {L.ARG_TASK_ID: exp.task_id}
        if ev.attempt:
            args[L.ARG_RAY_ATTEMPT] = ev.attempt
        begin(track, L.RAY_TASK_PREFIX + (ev.name or exp.name), start, category=L.CAT_RAY,
              args=args)
        last = start
        for name, p_start, p_end in ev.phases:
            # p_start into [last, end], p_end into [p_start, end]
            if p_start < last:
                p_start = last
            if p_start > end:
                p_start = end
            if p_end < p_start:
                p_end = p_start
            elif p_end > end:
                p_end = end
            begin(track, name, p_start, category=L.CAT_RAY)
            finish(track, p_end)
            last = p_end
        finish(track, end)

    def _attempts(self, events: Iterable[RayTaskEvents]) -> dict[str, list[RayTaskEvents]]:
        """Of the tasks expected for their states alone, each one's attempts among
        ``events``, in order (Ray begins a retry after the attempt before it ended)."""
        found: dict[str, list[RayTaskEvents]] = {}
        states_only = self._states_only
        for ev in events:
            if ev.ray_task_id in states_only:
                found.setdefault(ev.ray_task_id, []).append(ev)
        for attempts in found.values():
            attempts.sort(key=lambda ev: ev.attempt)
        return found

    def draw_attempts_states(
        self, task: TimelineTask, name: str, attempts: list[RayTaskEvents]
    ) -> None:
        """Ray's states of a task with no execution: its attempts' (in order, each after
        the one before, so one after another in its slice), now."""
        if not self.enabled or not attempts:
            return
        states = tuple(state for ev in attempts for state in ev.states)
        last = attempts[-1]
        self._states(task, name, dataclasses.replace(last, states=states), last.worker_pid)

    def _states(
        self, task: TimelineTask, name: str, ev: RayTaskEvents, worker_pid: int = 0
    ) -> None:
        """Ray's states within the task's 'dispatched' slice, once that slice has ended.

        ``worker_pid``: the worker Ray's events say ran it, for a task with no execution
        to say so (a worker Ray killed along with others: its OOM report does not say
        which of them ran which task; the query layer takes this one's figure)."""
        if task.ray_states_drawn or not ev.states:
            return
        if task.dispatch_ts is None or task.end_ts is None:
            return
        lo, hi = task.dispatch_ts, task.end_ts
        if hi <= lo:
            return
        w = self.writer
        track = self._states_lane(lo, hi)
        # The task's states in one slice that names it: trace_processor merges the lanes
        # (one name) and would scatter the states of one lane's tasks over its merged
        # lanes; nested, they stay together, and the query layer finds the task.
        head: dict[str, object] = {L.ARG_TASK_ID: task.task_id}
        if task.attempt:
            head[L.ARG_ATTEMPT] = task.attempt
        if worker_pid:
            head[L.ARG_WORKER_PID] = worker_pid
        begin, finish = w.begin, w.end
        begin(track, L.RAY_STATES_PREFIX + name, lo, category=L.CAT_RAY, args=head)
        # Each state from its start, clamped into [lo, hi], until the next one's (the
        # last until hi); one that would not last is not drawn, but for
        # SUBMITTED_TO_WORKER: a task can reach its worker before its producer says it
        # was dispatched (Ray Data reports a submission once Ray's submit returned, and
        # a warm actor may be running it by then); drawn 0 long at the dispatch, it
        # says so, and the latency split (queue, push) has its boundary. Spelled out,
        # as in _phases: this runs for every task.
        states = ev.states
        ts = states[0][1]
        start = lo if ts < lo else hi if ts > hi else ts
        for i, (name, _) in enumerate(states, 1):
            if i < len(states):
                ts = states[i][1]
                until = lo if ts < lo else hi if ts > hi else ts
            else:
                until = hi
            if until > start or name == L.STATE_SUBMITTED:
                begin(track, name, start, category=L.CAT_RAY)
                finish(track, until)
            start = until
        finish(track, hi)
        # Once, never again (another attempt's states would overlap these).
        task.ray_states_drawn = True

    def _states_lane(self, lo: int, hi: int) -> Track:
        """A states lane free before ``lo`` (the one free longest), else a new one: each
        lane's slices are written in time order, as the reader's scan wants them."""
        lanes = self._state_lanes
        if lanes and lanes[0][0] < lo:
            _, n, track = lanes[0]
            heapq.heapreplace(lanes, (hi, n, track))
            return track
        track = self.writer.track(L.RAY_STATES_TRACK, parent=self.states_parent, rank=1)
        heapq.heappush(lanes, (hi, len(lanes), track))
        return track

"""What the reader engine keeps of a trace: a row per task attempt and per execution, and sums.

:class:`TraceRows` is a :class:`~tracer.format.TraceVisitor`: it is handed
every slice of the trace once (by :func:`tracer.format.scan_trace`, or from
a :class:`~tracer.format.TraceModel` by :func:`rows_from_model`) and keeps
only what the analyses of ``tracer/query/sql`` read:

* ``tracer_task``: the task slices (category ``task``, depth 0), with the
  timestamps of their ``dispatched`` children;
* ``tracer_execution``: the executions (category ``execution``, not
  ``task failed``, ended, on a worker's track or a lane under it), with the
  names of their node and worker;
* Ray's events where the trace has them: the ``SUBMITTED_TO_WORKER`` and
  ``FINISHED``/``FAILED`` states on ``Ray states`` tracks, resolved to the
  task slice on the parent lane, and the ``ray task <name>`` spans on the
  workers' ``Ray phases`` tracks with the end of their ``deserialize
  arguments`` phase (``tracer_ray_state`` and ``tracer_ray_span``);
* the ``task failed`` / ``task cancelled`` marks on a node's or a worker's
  track: where a task with no execution stopped (``tracer_mark``);
* the dispatch loop's time per phase, as running sums (dispatch_loop.sql);
* the trace's first and last moment (``MIN(ts)``, ``MAX(ts + MAX(dur, 0))``
  over the slice table, instants included) and the run's info slice.

So memory grows with the number of tasks, not with the trace's events. The
rules are those of the SQL files (same joins, same NULL rules), which
``tests/query`` checks against trace_processor.
"""

from __future__ import annotations

import bisect
import math
import os
from collections import defaultdict
from typing import Any

from tracer.errors import TraceOrderError
from tracer.format import (
    DEFAULT_WINDOW_NS,
    ScannedInstant,
    ScannedSlice,
    TraceModel,
    TraceScan,
    TraceVisitor,
    TrackInfo,
    scan_trace,
)
from tracer.ray import layout as L

__all__ = ["PHASES", "RAY_EVENTS_INFO", "RUN_INFO", "TraceRows", "rows_from_model", "scan_rows"]

#: ``run_info``'s keys: from the dispatch loop's first ``execution`` slice (the
#: driver's GC figures from its END: None in traces written before them) ...
RUN_INFO = ("execution_id", "runner", "tracing_level", L.ARG_DRIVER_GC_COLLECTIONS,
            L.ARG_DRIVER_GC_NS, L.ARG_DRIVER_GC_LONGEST_NS, L.ARG_ERROR_TYPE, L.ARG_ERROR,
            L.ARG_MEMORY_REQUEST_MISMATCHES, L.ARG_MEMRAY_PER_TASK,
            L.ARG_MEMRAY_PER_TASK_REASON, L.ARG_LOST_MEASUREMENTS, L.ARG_MEASUREMENTS_STOPPED)
#: ... and from its ``Ray's events read`` instant (None without one: Ray's events were
#: not read); the trace's args of these names.
RAY_EVENTS_INFO = (L.ARG_RAY_EVENTS_SOURCE, L.ARG_RAY_EVENTS_MISSING, L.ARG_RAY_EVENTS_DROPPED)

#: The dispatch loop's phases, in display order.
PHASES = (
    L.SLICE_PLAN_POLLING,
    L.SLICE_BATCHING,
    L.SLICE_DISPATCHING,
    L.SLICE_AWAITING,
    L.SLICE_NOOP_TASK,
)
_LOOP_NAMES = frozenset((L.SLICE_EXECUTION, L.SLICE_WAVE, *PHASES))
_PHASE_NAMES = frozenset(PHASES)
#: A node's track: its name starts so (tracer_tables.sql's GLOB 'Node *').
_NODE_PREFIX = L.NODE_PROCESS_PREFIX + " "
#: Where a task with no execution stopped (tracer_tables.sql's tracer_mark).
_MARK_NAMES = frozenset((L.INSTANT_TASK_FAILED, L.INSTANT_TASK_CANCELLED))
#: Ray's states (tracer_tables.sql's tracer_ray_state).
_STATE_NAMES = frozenset((L.STATE_PENDING_ARGS, L.STATE_PENDING_NODE, L.STATE_SUBMITTED,
                          L.STATE_RUNNING, L.STATE_FINISHED, L.STATE_FAILED))

# A task row: (id, created_ts, task_id, attempt, stage_id, stage, status,
#              memory_requested, memory_at_kill, received_ts, dispatched)
# where dispatched is None, a timestamp, or a tuple of them (several children).
TaskRow = tuple[Any, ...]
# An execution row: (id, start_ts, task_id, stage, end_ts, memory_requested,
#                    memory_peak, peak_source, status, node, worker)
ExecutionRow = tuple[Any, ...]
# Ray's handling of a task in its worker: (id, task_id, start_ts, end_ts, args_end_ts).
RaySpan = tuple[Any, ...]


def arg(args: dict[str, Any], *path: str) -> Any:
    """A scalar annotation (``EXTRACT_ARG``): None for a missing key or a dict/list."""
    value: Any = args
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return None if isinstance(value, (dict, list)) else value


def byte_amount(args: dict[str, Any], *path: str) -> int | None:
    """A byte amount from the args, or None when it is not a number of bytes.

    tracer.ray writes ints; a trace from elsewhere may hold a string, a bool
    or an infinite float there, which is treated as not measured rather than
    stopping every analysis that compares or sums amounts.
    """
    value = arg(args, *path)
    if value.__class__ is bool:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


class TraceRows(TraceVisitor):
    """The reader engine's tables, collected from a stream of slices (see the module doc)."""

    def __init__(self) -> None:
        self.tasks: list[TaskRow] = []
        self.executions: list[ExecutionRow] = []
        #: 'actor starting' slices (an engine's actor pools): (stage_id, stage, status, dur).
        self.actor_starts: list[tuple[Any, Any, Any, int | None]] = []
        #: Stage slices with the engine's queue figures: (stage_id, stage, queued_blocks_max,
        #: backpressured_ns).
        self.stage_queues: list[tuple[Any, Any, Any, Any]] = []
        #: Task attempts that failed or were cancelled: (created_ts, id, task_id, attempt,
        #: stage_id, stage, status, error_type, error).
        self.failures: list[tuple[Any, ...]] = []
        #: Task slices that say Ray retried them: id -> (ray_attempts, unmeasured_attempts).
        self.task_attempts: dict[int, tuple[Any, Any]] = {}
        #: Executions of a retry (Ray's attempt > 0): id -> that attempt.
        self.execution_attempts: dict[int, Any] = {}
        #: Tasks with an attempt Ray's OOM killer killed and Ray ran again: task_id -> the
        #: largest memory at such a kill.
        self.retried_kills: dict[Any, Any] = {}
        #: Those attempts' marks: (task_id, ts, id, error_type, memory at the kill or None,
        #: track uuid), the uuid resolved to (node, worker) by finish().
        self.retried_marks: list[tuple[Any, ...]] = []
        #: 'failed attempt' slices (category attempt): task_id -> their durations, summed.
        self.attempt_time: dict[Any, int] = {}
        #: Executions that failed or were cancelled: id -> their error type.
        self.execution_errors: dict[int, Any] = {}
        # 'dispatched' slices whose task slice was not handed over yet: parent id -> timestamps.
        self._children: dict[int, list[int]] = {}
        self._strings: dict[str, str] = {}  # one copy of each repeated string (stage names...)
        self.start: int | None = None
        self.end: int | None = None
        self.run_info: dict[str, Any] = {}
        self._run_info_key: tuple[int, int] | None = None
        #: The first 'Ray's events read' instant's args (RAY_EVENTS_INFO), if any.
        self.ray_events_info: dict[str, Any] = {}
        self._ray_events_key: tuple[int, int] | None = None
        # The dispatch loop (see dispatch_loop.sql): per phase (count, total, nested in it).
        self.phase_count: dict[str, int] = dict.fromkeys(PHASES, 0)
        self.phase_total: dict[str, int] = dict.fromkeys(PHASES, 0)
        self.phase_nested: dict[str, int] = dict.fromkeys(PHASES, 0)
        self.span = 0  # the loop's execution slices
        self.waves = 0
        self.in_waves = 0  # phases directly in a wave
        self.outside_waves = 0  # phases in neither a wave nor a phase
        # Loop slices that never ended: their duration runs to the trace's end.
        self._open_loop: list[ScannedSlice] = []
        self.finished = False
        self.scan: TraceScan | None = None
        # Ray's events: spans (RaySpan, args_end_ts resolved at the end), the
        # end of each span's 'deserialize arguments' phases, and states as
        # (track uuid, ts, id, name, task_id, attempt) until finish() resolves
        # them to task slices.
        self.ray_spans: list[RaySpan] = []
        self._args_end: dict[int, int] = {}
        self._states: list[tuple[Any, ...]] = []
        # 'ray states <stage>' slices: id -> (ts, task_id, attempt, worker_pid); their
        # states' parent.
        self._state_heads: dict[int, tuple[int, Any, Any, Any]] = {}
        #: task slice id -> (submitted_ts, replied_ts, worker_pid), each maybe None (the
        #: worker Ray's events name on a task with no execution).
        self.ray_states: dict[int, tuple[int | None, int | None, int | None]] = {}
        #: task slice id -> {pid: memory used at the kill} of the workers a task killed
        #: with others may have run in (ARG_OOM_KILLED_WORKERS).
        self.kill_candidates: dict[int, dict[int, int]] = {}
        # Failure marks as (task_id, ts, track uuid) until finish() resolves them into
        # marks: (task_id, ts) -> (node, worker), the worker None on a node's track.
        self._marks: list[tuple[Any, int, int]] = []
        self.marks: dict[tuple[Any, int], tuple[str | None, str | None]] = {}

    # ------------------------------------------------------------ the stream

    def _intern(self, value: Any) -> Any:
        if value.__class__ is str:
            return self._strings.setdefault(value, value)
        return value

    def slice(self, s: ScannedSlice) -> None:
        ts = s.ts
        dur = s.dur
        end = ts + dur if dur is not None and dur > 0 else ts
        if self.start is None:
            self.start = ts
            self.end = end
        else:
            if ts < self.start:
                self.start = ts
            if end > self.end:  # type: ignore[operator]
                self.end = end
        category = s.category
        if category == L.CAT_TASK:
            if s.depth == 0:
                self._task(s)
            if s.name == L.SLICE_DISPATCHED and s.parent_id is not None:
                self._children.setdefault(s.parent_id, []).append(ts)
        elif category == L.CAT_EXECUTION:
            if s.name is not None and s.name != L.INSTANT_TASK_FAILED and dur is not None:
                self._execution(s)
        elif category == L.CAT_STAGE:
            args = s.args
            if s.name == L.SLICE_ACTOR_STARTING:
                self.actor_starts.append((
                    arg(args, L.ARG_STAGE_ID), arg(args, L.ARG_STAGE), arg(args, L.ARG_STATUS),
                    dur,
                ))
            elif s.depth == 0 and args and (
                L.ARG_QUEUED_BLOCKS_MAX in args or L.ARG_BACKPRESSURED_NS in args
            ):
                self.stage_queues.append((
                    arg(args, L.ARG_STAGE_ID), s.name, arg(args, L.ARG_QUEUED_BLOCKS_MAX),
                    arg(args, L.ARG_BACKPRESSURED_NS),
                ))
        elif category == L.CAT_SCHEDULER and s.name not in _LOOP_NAMES:
            self._ray(s)
        elif category == L.CAT_ATTEMPT:
            if dur is not None and dur >= 0:
                task_id = arg(s.args, L.ARG_TASK_ID)
                self.attempt_time[task_id] = self.attempt_time.get(task_id, 0) + dur
        elif category == L.CAT_SCHEDULER:
            if s.name == L.SLICE_EXECUTION and s.depth == 0:
                key = (ts, s.id)
                if self._run_info_key is None or key < self._run_info_key:
                    self._run_info_key = key
                    self.run_info = {k: arg(s.args, k) for k in RUN_INFO}
            if dur is None:
                self._open_loop.append(s)
            else:
                self._loop(s.name, s.parent_name, dur)

    def _ray(self, s: ScannedSlice) -> None:
        """One of Ray's events (category scheduler, as the loop's slices)."""
        name = s.name
        if name is None:
            return
        if name in _STATE_NAMES:
            attempt = arg(s.args, L.ARG_ATTEMPT) if s.args else None
            self._states.append((s.track_uuid, s.ts, s.id, name,
                                 arg(s.args, L.ARG_TASK_ID) if s.args else None,
                                 0 if attempt is None else attempt,
                                 s.parent_id if s.depth == 1 else None))
            return
        if s.depth == 0 and name.startswith(L.RAY_STATES_PREFIX):
            attempt = arg(s.args, L.ARG_ATTEMPT)
            self._state_heads[s.id] = (s.ts, arg(s.args, L.ARG_TASK_ID),
                                       0 if attempt is None else attempt,
                                       arg(s.args, L.ARG_WORKER_PID))
            return
        dur = s.dur
        if dur is None or dur < 0:
            return
        if name == L.PHASE_DESERIALIZE:
            if s.parent_id is not None:
                end = s.ts + dur
                old = self._args_end.get(s.parent_id)
                if old is None or end > old:
                    self._args_end[s.parent_id] = end
        elif s.depth == 0 and name.startswith(L.RAY_TASK_PREFIX):
            self.ray_spans.append((s.id, arg(s.args, L.ARG_TASK_ID), s.ts, s.ts + dur, None))

    def instant(self, i: ScannedInstant) -> None:
        if i.category == L.CAT_EXECUTION and i.name in _MARK_NAMES:
            task_id = arg(i.args, L.ARG_TASK_ID)
            self._marks.append((task_id, i.ts, i.track_uuid))
            if i.name == L.INSTANT_TASK_FAILED and arg(i.args, L.ARG_RETRIED) is not None:
                used = byte_amount(i.args, L.ARG_MEMORY_AT_KILL)
                self.retried_marks.append(
                    (task_id, i.ts, i.id, arg(i.args, L.ARG_ERROR_TYPE), used, i.track_uuid))
                if used is not None:  # as tracer_retried_kill: the largest of a task's
                    old = self.retried_kills.get(task_id)
                    if old is None or used > old:
                        self.retried_kills[task_id] = used
        elif i.name == L.INSTANT_RAY_EVENTS and i.category == L.CAT_SCHEDULER:
            key = (i.ts, i.id)
            if self._ray_events_key is None or key < self._ray_events_key:
                self._ray_events_key = key
                self.ray_events_info = {k: arg(i.args, k) for k in RAY_EVENTS_INFO}
        ts = i.ts
        if self.start is None:
            self.start = self.end = ts
        else:
            if ts < self.start:
                self.start = ts
            if ts > self.end:  # type: ignore[operator]
                self.end = ts

    def _task(self, t: ScannedSlice) -> None:
        args = t.args
        status = arg(args, L.ARG_STATUS)
        attempt = arg(args, L.ARG_ATTEMPT)
        stage = arg(args, L.ARG_STAGE)
        received = None
        if t.dur is None:
            if status is None:
                status = L.STATUS_UNFINISHED  # in flight where the trace was cut
        elif (status or "") not in ("unfinished", "superseded"):
            received = t.ts + t.dur
        candidates = args.get(L.ARG_OOM_KILLED_WORKERS) if args else None
        if isinstance(candidates, dict):
            self._kill_candidates(t.id, candidates)
        children = self._children.pop(t.id, None)
        dispatched: Any = None
        if children is not None:
            dispatched = children[0] if len(children) == 1 else tuple(sorted(children))
        intern = self._intern
        ray_attempts = arg(args, L.ARG_RAY_ATTEMPTS)
        if ray_attempts is not None:
            self.task_attempts[t.id] = (ray_attempts, arg(args, L.ARG_UNMEASURED_ATTEMPTS))
        if status in (L.STATUS_FAILED, L.STATUS_CANCELLED):
            self.failures.append((
                t.ts, t.id, arg(args, L.ARG_TASK_ID), 0 if attempt is None else attempt,
                arg(args, L.ARG_STAGE_ID), t.name if stage is None else stage, status,
                arg(args, L.ARG_ERROR_TYPE), arg(args, L.ARG_ERROR),
            ))
        self.tasks.append(
            (
                t.id,
                t.ts,
                arg(args, L.ARG_TASK_ID),
                0 if attempt is None else attempt,
                arg(args, L.ARG_STAGE_ID),
                intern(t.name if stage is None else stage),
                intern(status),
                byte_amount(args, L.ARG_RESOURCE_REQUEST, "memory_bytes"),
                byte_amount(args, L.ARG_MEMORY_AT_KILL),
                received,
                dispatched,
            )
        )

    def _execution(self, s: ScannedSlice) -> None:
        args = s.args
        ray_attempt = arg(args, L.ARG_RAY_ATTEMPT)
        if ray_attempt:
            self.execution_attempts[s.id] = ray_attempt
        status = arg(args, L.ARG_STATUS)
        if status == L.STATUS_FAILED or status == L.STATUS_CANCELLED:
            self.execution_errors[s.id] = arg(args, L.ARG_ERROR_TYPE)
        peak = byte_amount(args, L.ARG_MEMORY_PEAK)
        source = None
        if peak is not None:
            if byte_amount(args, L.ARG_HEAP_PEAK) is not None:
                source = "heap"
            elif byte_amount(args, L.ARG_USS_PEAK) == peak:
                source = "uss"  # the engine's own per-task figure (Ray Data), the larger
            else:
                source = "rss"
        self.executions.append(
            (
                s.id,
                s.ts,
                arg(args, L.ARG_TASK_ID),
                s.name,
                s.ts + s.dur,  # type: ignore[operator]
                byte_amount(args, L.ARG_MEMORY_REQUESTED),
                peak,
                source,
                self._intern(arg(args, L.ARG_STATUS)),
                s.track_uuid,  # the node and worker once the tracks are known
                None,
            )
        )

    def _loop(self, name: str | None, parent: str | None, dur: int) -> None:
        if name == L.SLICE_EXECUTION:
            self.span += dur
        elif name == L.SLICE_WAVE:
            self.waves += dur
        else:
            assert name is not None
            self.phase_count[name] += 1
            self.phase_total[name] += dur
            if parent in _PHASE_NAMES:
                self.phase_nested[parent] += dur
            elif parent == L.SLICE_WAVE:
                self.in_waves += dur
            else:
                self.outside_waves += dur

    # --------------------------------------------------------------- the end

    def finish(self, tracks: dict[int, TrackInfo]) -> None:
        """After the last slice: resolve what needed the whole trace."""
        if self.finished:
            return
        self.finished = True
        end = self.end
        for s in self._open_loop:
            self._loop(s.name, s.parent_name, (end if end is not None else s.ts) - s.ts)
        self._open_loop = []
        if self._children:
            self._late_children()
        self.tasks.sort(key=lambda t: (t[1], t[0]))
        places: dict[int, tuple[str | None, str | None] | None] = {}
        executions: list[ExecutionRow] = []
        for e in self.executions:
            uuid = e[9]
            if uuid in places:
                place = places[uuid]
            else:
                place = places[uuid] = _worker_of(tracks, uuid)
            if place is not None:  # measured in a worker: on (or under) its track
                executions.append((*e[:9], *place))
        executions.sort(key=lambda e: (e[1], e[0]))
        self.executions = executions
        self._resolve_marks(tracks)
        self._resolve_ray(tracks)
        self.retried_marks = [(*m[:5], *_place_of_mark(tracks, m[5])) for m in self.retried_marks]

    def _resolve_marks(self, tracks: dict[int, TrackInfo]) -> None:
        """As tracer_mark: a mark on a node's track, or on a worker's under one; of two
        marks of one task at one time, the least node and worker names (SQL's MIN)."""
        marks = self.marks
        for task_id, ts, uuid in self._marks:
            track = tracks.get(uuid)
            if track is None or task_id is None:
                continue
            if _is_node(track):
                place: tuple[str | None, str | None] = (track.name, None)
            else:
                parent = _parent(tracks, track)
                if not _is_node(parent):
                    continue
                assert parent is not None
                place = (parent.name, track.name)
            old = marks.get((task_id, ts))
            if old is not None:
                place = (_least(old[0], place[0]), _least(old[1], place[1]))
            marks[(task_id, ts)] = place
        self._marks = []

    def _kill_candidates(self, slice_id: int, candidates: dict[Any, Any]) -> None:
        found: dict[int, int] = {}
        for pid, memory in candidates.items():
            # As tracer_kill_candidate: integer amounts under integer pids only.
            if memory.__class__ is int and str(pid).isdigit():
                found[int(pid)] = memory
        if found:
            self.kill_candidates[slice_id] = found

    def _resolve_ray(self, tracks: dict[int, TrackInfo]) -> None:
        """Ray's spans get their arguments' end; states go to the task slice they belong to.

        As tracer_ray_state: the states nested in a ``ray states <stage>``
        slice are the task's it names; in traces from before those slices, on
        each ``Ray states`` track (by ts, then id), a state with a task_id
        starts that task's states. They go to the task slice of that task_id
        and attempt created last at or before the first of them.
        """
        args_end = self._args_end
        self._args_end = {}
        self.ray_spans = [(*r[:4], args_end.get(r[0])) for r in self.ray_spans]
        states = self._states
        heads = self._state_heads
        self._states = []
        self._state_heads = {}
        if not states:
            return
        tasks_by_key: dict[tuple[Any, Any], list[tuple[int, int]]] = defaultdict(list)
        for t in self.tasks:  # sorted by (created_ts, id)
            if t[2] is not None:
                tasks_by_key[(t[2], t[3])].append((t[1], t[0]))
        found: dict[int, list[int | None]] = {}

        def task_of(task_id: Any, attempt: Any, ts: int) -> list[int | None] | None:
            keys = tasks_by_key.get((task_id, attempt))
            if keys:
                i = bisect.bisect_right(keys, (ts, _MAX_ID)) - 1
                if i >= 0:
                    return found.setdefault(keys[i][1], [None, None, None])
            return None

        def note(pair: list[int | None], name: str, ts: int) -> None:
            if name == L.STATE_SUBMITTED:
                slot = 0
            elif name in (L.STATE_FINISHED, L.STATE_FAILED):
                slot = 1
            else:
                return
            old = pair[slot]
            if old is None or ts > old:  # the last attempt's (tracer_ray_state's MAX)
                pair[slot] = ts

        by_track: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
        pairs: dict[int, list[int | None] | None] = {}  # by head id
        for st in states:
            head_id = st[6]
            head = heads.get(head_id) if head_id is not None else None
            if head is not None:
                if head_id in pairs:
                    pair = pairs[head_id]
                else:
                    pair = pairs[head_id] = task_of(head[1], head[2], head[0])
                    if pair is not None and head[3] is not None:
                        pair[2] = head[3]  # the worker Ray's events name
                if pair is not None:
                    note(pair, st[3], st[1])
                continue
            track = tracks.get(st[0])
            if track is not None and track.name == L.RAY_STATES_TRACK:
                by_track[st[0]].append(st)
        for on_track in by_track.values():
            on_track.sort(key=lambda st: (st[1], st[2]))
            pair = None
            for _, ts, _, name, task_id, attempt, _ in on_track:
                if task_id is not None:
                    pair = task_of(task_id, attempt, ts)
                if pair is not None:
                    note(pair, name, ts)
        self.ray_states = {k: (v[0], v[1], v[2]) for k, v in found.items()}

    def _late_children(self) -> None:
        """'dispatched' slices handed over after their task slice (it ended first)."""
        late = self._children
        self._children = {}
        tasks = self.tasks
        for i, t in enumerate(tasks):
            extra = late.get(t[0])
            if extra is None:
                continue
            old = t[10]
            known = [] if old is None else [old] if isinstance(old, int) else list(old)
            merged = sorted(known + extra)
            tasks[i] = (*t[:10], merged[0] if len(merged) == 1 else tuple(merged))


def _worker_of(tracks: dict[int, TrackInfo], uuid: int) -> tuple[str | None, str | None] | None:
    """(node, worker): the names of the node and worker tracks an execution's track is
    (or is a lane under); None if it is under no node.

    As tracer_tables.sql sees it: a worker's track is a child of a track named
    ``Node ...`` (tracer.ray.layout), and a lane of overlapping executions a
    child of the worker's track.
    """
    track = tracks.get(uuid)
    parent = _parent(tracks, track)
    if _is_node(parent):
        assert track is not None and parent is not None
        return parent.name, track.name
    grandparent = _parent(tracks, parent)
    if _is_node(grandparent):
        assert parent is not None and grandparent is not None
        return grandparent.name, parent.name
    return None


def _place_of_mark(tracks: dict[int, TrackInfo], uuid: int) -> tuple[str | None, str | None]:
    """(node, worker) of a mark on a node's track, or on a worker's under one; (None, None)
    elsewhere (as task_retries.sql's failed_attempt)."""
    track = tracks.get(uuid)
    if _is_node(track):
        assert track is not None
        return track.name, None
    parent = _parent(tracks, track)
    if _is_node(parent):
        assert track is not None and parent is not None
        return parent.name, track.name
    return None, None


def _least(a: str | None, b: str | None) -> str | None:
    return b if a is None else a if b is None else min(a, b)


def _parent(tracks: dict[int, TrackInfo], track: TrackInfo | None) -> TrackInfo | None:
    if track is None or track.parent_uuid is None:
        return None
    return tracks.get(track.parent_uuid)


def _is_node(track: TrackInfo | None) -> bool:
    return track is not None and (track.name or "").startswith(_NODE_PREFIX)


def rows_from_model(model: TraceModel) -> TraceRows:
    """The same rows from a trace read whole by :func:`tracer.format.read_trace`."""
    rows = TraceRows()
    names = {s.id: s.name for s in model.slices}
    for s in model.slices:
        rows.slice(
            ScannedSlice(
                s.id, s.track_uuid, s.name, s.category, s.ts, s.dur, s.depth, s.parent_id,
                s.args, s.flow_ids_out, s.flow_ids_in,
                None if s.parent_id is None else names.get(s.parent_id),
            )
        )
    for i in model.instants:
        rows.instant(
            ScannedInstant(
                i.id, i.track_uuid, i.name, i.category, i.ts, i.depth, i.parent_id, i.args,
                i.flow_ids_out, i.flow_ids_in,
                None if i.parent_id is None else names.get(i.parent_id),
            )
        )
    rows.finish(model.tracks)
    return rows



def scan_rows(path: str | os.PathLike[str]) -> tuple[TraceRows, TraceScan]:
    """The rows of the trace at ``path``, streamed (:func:`tracer.format.scan_trace`).

    A trace whose events on a track are further out of order than the scan's
    window (none of tracer's) is scanned again with a window that holds them,
    then, if that is not enough either, with no window (memory then grows
    with the trace's events).
    """
    window: int | None = DEFAULT_WINDOW_NS
    while True:
        rows = TraceRows()
        try:
            scan = scan_trace(path, rows, window_ns=window)
        except TraceOrderError as exc:
            if window is None:  # pragma: no cover - a scan without a window never raises it
                raise
            window = max(4 * exc.lateness_ns, _RETRY_WINDOW_NS) if window < _RETRY_WINDOW_NS \
                else None
            continue
        rows.finish(scan.tracks)
        rows.scan = scan
        return rows, scan


#: Above any slice id: bisects to the last task created at or before a timestamp.
_MAX_ID = 1 << 62

#: The window of a second scan of a trace out of order by more than the default's.
_RETRY_WINDOW_NS = 60_000_000_000

"""The analyses of the reader engine, computed from :class:`~tracer.query.collect.TraceRows`.

Each function here mirrors one file of ``tracer/query/sql`` step by step
(same joins, same NULL rules, same nearest-rank percentiles, same ordering),
so that both engines give the same rows; ``tests/query`` checks that they
agree. Results are lists of dicts; :func:`tracer.query.columns.to_frame`
types them.

``tracer_task_latency`` is a list of tuples (:data:`LATENCY_COLUMNS` names
their items): a million tasks stay a few hundred MB.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

from tracer.query.collect import PHASES, TraceRows
from tracer.query.sql import check_buckets
from tracer.ray import layout as L
from tracer.stats import nearest_rank

__all__ = [
    "GAPS_BETWEEN_WAVES",
    "GAPS_IN_WAVES",
    "LATENCY_COLUMNS",
    "RAY_PARTS",
    "dispatch_loop",
    "latency_by_stage",
    "latency_rows",
    "memory_by_node",
    "memory_by_stage",
    "memory_flagged",
    "nearest_rank",
    "stage_summary",
    "task_latency",
    "worker_utilisation",
]

Row = dict[str, Any]
_K = TypeVar("_K", bound=Hashable)

GAPS_IN_WAVES = "gaps in waves"
GAPS_BETWEEN_WAVES = "gaps between waves"

#: The columns of ``tracer_task_latency`` (tracer_tables.sql), in the order of its tuples.
LATENCY_COLUMNS = (
    "task_id",
    "attempt",
    "stage_id",
    "stage",
    "status",
    "node",
    "worker",
    "created_ts",
    "dispatched_ts",
    "started_ts",
    "finished_ts",
    "received_ts",
    "waiting_ns",
    "scheduling_ns",
    "running_ns",
    "pickup_ns",
    "total_ns",
    "memory_requested",
    "memory_peak",
    "peak_source",
    "memory_at_kill",
    "task_slice_id",
    "execution_slice_id",
    "sched_queue_ns",
    "sched_push_ns",
    "sched_args_ns",
    "sched_start_ns",
    "pickup_store_ns",
    "pickup_notify_ns",
    "pickup_loop_ns",
)
(
    TASK_ID, ATTEMPT, STAGE_ID, STAGE, STATUS, NODE, WORKER, CREATED, DISPATCHED, STARTED,
    FINISHED, RECEIVED, WAITING, SCHEDULING, RUNNING, PICKUP, TOTAL, MEM_REQUESTED, MEM_PEAK,
    PEAK_SOURCE, MEM_AT_KILL, TASK_SLICE, EXECUTION_SLICE, SCHED_QUEUE, SCHED_PUSH, SCHED_ARGS,
    SCHED_START, PICKUP_STORE, PICKUP_NOTIFY, PICKUP_LOOP,
) = range(len(LATENCY_COLUMNS))
#: Ray's parts of scheduling and of pickup, in time order (tracer_tables.sql).
RAY_PARTS = ("sched_queue", "sched_push", "sched_args", "sched_start",
             "pickup_store", "pickup_notify", "pickup_loop")
_PHASE_COLUMNS = {"waiting": WAITING, "scheduling": SCHEDULING, "running": RUNNING,
                  "pickup": PICKUP, "total": TOTAL,
                  **{part: SCHED_QUEUE + i for i, part in enumerate(RAY_PARTS)}}

Latency = list[tuple[Any, ...]]


# ------------------------------------------------------------------ helpers


def _sub(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def _clamp(value: int | None, lo: int | None, hi: int | None) -> int | None:
    """SQLite's ``MIN(MAX(value, lo), hi)``: None when any of them is."""
    if value is None or lo is None or hi is None:
        return None
    return min(max(value, lo), hi)


def _ray_parts(
    dispatched: int | None, started: int | None, finished: int | None, received: int | None,
    span: tuple[Any, ...] | None, states: tuple[int | None, int | None, int | None] | None,
) -> tuple[int | None, ...]:
    """Ray's parts of scheduling and pickup (tracer_tables.sql's ``bound`` steps)."""
    ray_start = ray_end = args_end = submitted = replied = None
    if span is not None:
        _, _, ray_start, ray_end, args_end = span
    if states is not None:
        submitted, replied = states[0], states[1]
    worker = _clamp(ray_start, dispatched, started)
    stored = _clamp(ray_end, finished, received)
    queued = _clamp(submitted, dispatched, worker)
    args = _clamp(args_end, worker, started)
    owner = _clamp(replied, stored, received)
    return (
        _sub(queued, dispatched), _sub(worker, queued), _sub(args, worker), _sub(started, args),
        _sub(stored, finished), _sub(owner, stored), _sub(received, owner),
    )


def _ray_span_of(spans: list[tuple[Any, ...]] | None, start: int) -> tuple[Any, ...] | None:
    """The span that started last at or before ``start``, else the first after it."""
    if not spans:
        return None

    def order(r: tuple[Any, ...]) -> tuple[bool, int, int]:
        before = r[2] <= start
        return (not before, -r[2] if before else r[2], r[0])

    return min(spans, key=order)


def _max(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _min(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _key(value: Any) -> tuple[bool, Any]:
    """Sort key that puts None first, as SQLite orders NULL."""
    return (value is not None, value)


def _group(rows: Iterable[Any], key: Callable[[Any], _K]) -> dict[_K, list[Any]]:
    groups: dict[_K, list[Any]] = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    return groups


def _over_request(row: tuple[Any, ...]) -> bool:
    req, peak = row[MEM_REQUESTED], row[MEM_PEAK]
    return req is not None and peak is not None and req > 0 and peak > req


def _by_stage(rows: Latency) -> list[tuple[Any, Latency]]:
    groups = _group(rows, lambda r: r[STAGE_ID])
    return sorted(groups.items(), key=lambda kv: _key(kv[0]))


def _values(rows: Latency, column: int) -> list[int]:
    return [r[column] for r in rows if r[column] is not None]


# ------------------------------------------------------------ base table


def latency_rows(rows: TraceRows) -> Latency:
    """``tracer_task_latency``: task attempts joined to their execution by ``task_id``.

    An execution goes to the latest attempt of its task_id created before it
    started; an attempt keeps its latest execution.
    """
    tasks = rows.tasks
    by_task_id: dict[Any, list[tuple[Any, ...]]] = defaultdict(list)
    for t in tasks:
        if t[2] is not None:
            by_task_id[t[2]].append(t)
    chosen: dict[int, tuple[Any, ...]] = {}
    for e in rows.executions:
        task_id = e[2]
        candidates = by_task_id.get(task_id) if task_id is not None else None
        if not candidates:
            continue
        start = e[1]
        if len(candidates) == 1:
            best = candidates[0]
        else:

            def order(t: tuple[Any, ...], start: int = start) -> tuple[bool, int, int]:
                before = t[1] <= start
                return (not before, -t[1] if before else t[1], t[0])

            best = min(candidates, key=order)
        current = chosen.get(best[0])
        if current is None or (start, e[0]) > (current[1], current[0]):
            chosen[best[0]] = e
    spans_by_task_id: dict[Any, list[tuple[Any, ...]]] = defaultdict(list)
    for r in rows.ray_spans:
        if r[1] is not None:
            spans_by_task_id[r[1]].append(r)
    ray_states = rows.ray_states
    kill_candidates = rows.kill_candidates
    marks = rows.marks
    retried_kills = rows.retried_kills
    out: Latency = []
    for t in tasks:
        t_id, created, task_id, attempt, stage_id, stage, status, requested, at_kill, received, \
            dispatched = t
        m = chosen.get(t_id)
        span = None
        if m is None:
            started = finished = m_requested = peak = source = m_status = None
            m_id = None
            # A task with no execution (Ray killed its worker): where its mark is.
            node, worker = marks.get((task_id, received), (None, None))
        else:
            m_id, started, e_task_id, _, finished, m_requested, peak, source, m_status, node, \
                worker = m
            span = _ray_span_of(spans_by_task_id.get(e_task_id), started)
        states = ray_states.get(t_id)
        if m is None and states is not None and states[2] is not None:
            # Killed with other workers: the one Ray's events say ran it, and its memory.
            ran_in = kill_candidates.get(t_id)
            if ran_in is not None and states[2] in ran_in:
                at_kill = ran_in[states[2]]
                if worker is None:
                    worker = f"{L.WORKER_THREAD_PREFIX} {states[2]}"
        if retried_kills:
            retried = retried_kills.get(task_id)
            if retried is not None and (at_kill is None or retried > at_kill):
                at_kill = retried  # an attempt Ray ran again, killed using more
        if status is not None:
            final_status = status
        elif m_status is not None:
            final_status = m_status
        else:
            final_status = "ok"
        total = None if received is None else received - created
        # None where the runner received it before it finished (received_unfinished): no
        # duration, where a negative one would pull a stage's percentiles down.
        pickup = (None if received is None or finished is None or received < finished
                  else received - finished)
        running = None if finished is None or started is None else finished - started
        for d in _each(dispatched):
            out.append(
                (
                    task_id, attempt, stage_id, stage, final_status, node, worker,
                    created, d, started, finished, received,
                    None if d is None else d - created,
                    None if started is None or d is None else started - d,
                    running, pickup, total,
                    requested if m_requested is None else m_requested,
                    peak, source, at_kill, t_id, m_id,
                    *_ray_parts(d, started, finished, received, span, states),
                )
            )
    return out


def _each(dispatched: Any) -> tuple[Any, ...]:
    if dispatched is None or isinstance(dispatched, int):
        return (dispatched,)
    return tuple(dispatched)


# ---------------------------------------------------------------- analyses


def task_latency(latency: Latency) -> list[Row]:
    """``task_latency.sql``."""
    ordered = sorted(
        latency, key=lambda r: (_key(r[CREATED]), _key(r[TASK_ID]), _key(r[ATTEMPT]))
    )
    return [dict(zip(LATENCY_COLUMNS, r, strict=True)) for r in ordered]


def stage_summary(latency: Latency) -> list[Row]:
    """``stage_summary.sql``."""
    out: list[Row] = []
    for stage_id, rows in _by_stage(latency):
        durs = _values(rows, RUNNING)
        peaks = _values(rows, MEM_PEAK)
        out.append(
            {
                "stage_id": stage_id,
                "stage": _min(r[STAGE] for r in rows),
                "tasks": len(rows),
                "failed": sum(1 for r in rows if r[STATUS] == "failed"),
                "wall_ns": _sub(_max(r[RECEIVED] for r in rows), _min(r[CREATED] for r in rows)),
                "dur_p50_ns": nearest_rank(durs, 50),
                "dur_p95_ns": nearest_rank(durs, 95),
                "dur_max_ns": _max(durs),
                "memory_requested": _max(r[MEM_REQUESTED] for r in rows),
                "peak_p50_bytes": nearest_rank(peaks, 50),
                "peak_max_bytes": _max(peaks),
                "over_request": sum(1 for r in rows if _over_request(r)),
            }
        )
    return out


def actor_starts(rows: TraceRows) -> list[Row]:
    """``actor_starts.sql``."""
    out: list[Row] = []
    groups = _group(rows.actor_starts, lambda r: r[0])
    for stage_id, actors in sorted(groups.items(), key=lambda kv: _key(kv[0])):
        ready = sorted(r[3] for r in actors if r[2] is None and r[3] is not None and r[3] >= 0)
        out.append(
            {
                "stage_id": stage_id,
                "stage": _min(r[1] for r in actors),
                "actors": len(actors),
                "ready": len(ready),
                "start_p50_ns": nearest_rank(ready, 50),
                "start_max_ns": _max(ready),
            }
        )
    return out


def stage_queues(rows: TraceRows) -> list[Row]:
    """``stage_queues.sql``."""
    out: list[Row] = []
    groups = _group(rows.stage_queues, lambda r: r[0])
    for stage_id, figures in sorted(groups.items(), key=lambda kv: _key(kv[0])):
        held = [r[3] for r in figures if r[3] is not None]
        out.append(
            {
                "stage_id": stage_id,
                "stage": _min(r[1] for r in figures),
                "queued_blocks_max": _max(r[2] for r in figures),
                "backpressured_ns": sum(held) if held else None,
            }
        )
    return out


def task_failures(rows: TraceRows) -> list[Row]:
    """``task_failures.sql``."""
    return [
        {"task_id": task_id, "attempt": attempt, "stage_id": stage_id, "stage": stage,
         "status": status, "error_type": error_type, "error": error}
        for _, _, task_id, attempt, stage_id, stage, status, error_type, error
        in sorted(rows.failures, key=lambda r: (r[0], r[1]))
    ]


def task_retries(rows: TraceRows) -> list[Row]:
    """``task_retries.sql``."""
    # task_id -> (the highest Ray attempt of its executions, its last execution's node)
    ran: dict[Any, tuple[int, Any]] = {}
    attempts = rows.execution_attempts
    by_task: dict[Any, list[tuple[Any, ...]]] = defaultdict(list)
    for e in rows.executions:  # in (start_ts, id) order: the last one's node stays
        before = ran.get(e[2])
        highest = max(before[0] if before else 0, _int(attempts.get(e[0])))
        ran[e[2]] = (highest, e[9])
        by_task[e[2]].append(e)
    # Failed attempts: (task_id, ts, id, error_type, memory, node, worker, lost)
    failed_rows: list[tuple[Any, ...]] = [(*m, None) for m in rows.retried_marks]
    errors = rows.execution_errors
    for task_id, execs in by_task.items():
        last = max(execs, key=lambda e: (e[1], e[0]))
        for e in execs:  # measured failures before the task's last execution
            if e is not last and e[8] in (L.STATUS_FAILED, L.STATUS_CANCELLED):
                failed_rows.append(
                    (task_id, e[4], e[0], errors.get(e[0]), None, e[9], e[10], e[4] - e[1]))
    # task_id -> (seen, first's error type, largest memory, first's node, worker, lost)
    failed: dict[Any, list[Any]] = {}
    for task_id, _, _, error_type, used, node, worker, lost in sorted(
            failed_rows, key=lambda m: (m[1], m[2])):
        seen = failed.get(task_id)
        if seen is None:
            failed[task_id] = [1, error_type, used, node, worker, lost]
            continue
        seen[0] += 1
        if used is not None and (seen[2] is None or used > seen[2]):
            seen[2] = used
        if lost is not None:
            seen[5] = lost if seen[5] is None else seen[5] + lost
    out: list[Row] = []
    for t in rows.tasks:  # in (created_ts, id) order
        said = rows.task_attempts.get(t[0])
        execution = ran.get(t[2])
        marks = failed.get(t[2])
        count = max(_int(said[0]) if said else 1, execution[0] + 1 if execution else 1,
                    marks[0] + 1 if marks else 1)
        if count < 2:
            continue
        ran_for = rows.attempt_time.get(t[2])
        lost = marks[5] if marks else None
        out.append({
            "task_id": t[2], "attempt": t[3], "stage_id": t[4], "stage": t[5],
            "status": "ok" if t[6] is None else t[6], "ray_attempts": count,
            "unmeasured_attempts": said[1] if said else None,
            "failed_attempts_seen": marks[0] if marks else 0,
            "error_type": marks[1] if marks else None,
            "memory_at_kill": marks[2] if marks else None,
            "failed_node": marks[3] if marks else None,
            "failed_worker": marks[4] if marks else None,
            "lost_ns": None if lost is None and ran_for is None else (lost or 0) + (ran_for or 0),
            "node": execution[1] if execution else None,
        })
    return out


def _int(value: Any) -> int:
    """An attempt count as an int (0 where it is not one)."""
    return value if isinstance(value, int) and value.__class__ is not bool else 0


def latency_by_stage(latency: Latency) -> list[Row]:
    """``latency_by_stage.sql``."""
    out: list[Row] = []
    for stage_id, rows in _by_stage(latency):
        row: Row = {"stage_id": stage_id, "stage": _min(r[STAGE] for r in rows),
                    "tasks": len(rows)}
        for phase, column in _PHASE_COLUMNS.items():
            values = _values(rows, column)
            row[f"{phase}_p50_ns"] = nearest_rank(values, 50)
            row[f"{phase}_p95_ns"] = nearest_rank(values, 95)
        out.append(row)
    return out


def dispatch_loop(rows: TraceRows) -> list[Row]:
    """``dispatch_loop.sql``."""
    span = rows.span
    table: list[tuple[str, int | None, int]] = []
    for phase in PHASES:
        count = rows.phase_count[phase]
        if count:
            table.append((phase, count, rows.phase_total[phase] - rows.phase_nested[phase]))
    table.append((GAPS_IN_WAVES, None, rows.waves - rows.in_waves))
    table.append((GAPS_BETWEEN_WAVES, None, span - rows.waves - rows.outside_waves))
    return [
        {
            "phase": phase,
            "count": count,
            "total_ns": total,
            "mean_ns": None if not count else total / count,
            "share": None if span == 0 else total / span,
        }
        for phase, count, total in table
    ]


def worker_utilisation(rows: TraceRows, buckets: int = 20) -> list[Row]:
    """``worker_utilisation.sql`` with ``buckets`` buckets."""
    check_buckets(buckets)
    execs = rows.executions
    start, end = rows.start, rows.end
    if not execs or start is None or end is None:
        return []
    size = max((end - start + buckets - 1) // buckets, 1)
    spans_by_task_id: dict[Any, list[tuple[Any, ...]]] = defaultdict(list)
    for r in rows.ray_spans:
        if r[1] is not None:
            spans_by_task_id[r[1]].append(r)
    # Busy time per worker and bucket, each execution spread over the buckets it overlaps;
    # and again with its Ray span (tracer_ray_match's) around it.
    busy: dict[tuple[Any, Any], tuple[list[int], list[int]]] = {}
    for e in execs:
        worker = (e[9], e[10])
        pair = busy.get(worker)
        if pair is None:
            pair = busy[worker] = ([0] * buckets, [0] * buckets)
        e_start, e_end = e[1], e[4]
        _spread(pair[0], e_start, e_end, start, size)
        span = _ray_span_of(spans_by_task_id.get(e[2]), e_start) if e[2] is not None else None
        if span is not None:
            e_start, e_end = min(e_start, span[2]), max(e_end, span[3])
        _spread(pair[1], e_start, e_end, start, size)
    out: list[Row] = []
    for (node, worker), (per_bucket, with_ray) in sorted(
        busy.items(), key=lambda kv: (_key(kv[0][0]), _key(kv[0][1]))
    ):
        for i, busy_ns in enumerate(per_bucket):
            out.append(
                {
                    "node": node,
                    "worker": worker,
                    "bucket": i,
                    "start_ns": i * size,
                    "bucket_ns": size,
                    "busy_ns": busy_ns,
                    "busy_fraction": busy_ns / size,
                    "busy_with_ray_ns": with_ray[i],
                    "busy_with_ray_fraction": with_ray[i] / size,
                }
            )
    return out


def _spread(row: list[int], e_start: int, e_end: int, start: int, size: int) -> None:
    """Add [e_start, e_end) to the buckets of ``size`` from ``start`` that it overlaps."""
    first = max((e_start - start) // size, 0)
    for i in range(first, len(row)):
        lo = start + i * size
        if lo >= e_end:
            break
        hi = lo + size
        if e_start < hi and e_end > lo:
            row[i] += min(e_end, hi) - max(e_start, lo)


def memory_by_stage(latency: Latency) -> list[Row]:
    """``memory_by_stage.sql``."""
    out: list[Row] = []
    for stage_id, rows in _by_stage(latency):
        peaks = _values(rows, MEM_PEAK)
        ratios = [
            r[MEM_PEAK] / r[MEM_REQUESTED]
            for r in rows
            if r[MEM_REQUESTED] is not None and r[MEM_REQUESTED] > 0 and r[MEM_PEAK] is not None
        ]
        out.append(
            {
                "stage_id": stage_id,
                "stage": _min(r[STAGE] for r in rows),
                "tasks": len(rows),
                "measured": len(peaks),
                "requested_bytes": _max(r[MEM_REQUESTED] for r in rows),
                "peak_p50_bytes": nearest_rank(peaks, 50),
                "peak_max_bytes": _max(peaks),
                "over_request": sum(1 for r in rows if _over_request(r)),
                "no_request": sum(
                    1 for r in rows if not r[MEM_REQUESTED] and r[MEM_PEAK] is not None
                ),
                "oom_killed": sum(1 for r in rows if r[MEM_AT_KILL] is not None),
                "peak_to_request_max": _max(ratios),
            }
        )
    return out


def memory_by_node(latency: Latency) -> list[Row]:
    """``memory_by_node.sql``."""
    counted = [r for r in latency if r[MEM_PEAK] is not None or r[MEM_AT_KILL] is not None]
    out: list[Row] = []
    groups = _group(counted, lambda r: r[NODE])
    for node, all_rows in sorted(groups.items(), key=lambda kv: _key(kv[0])):
        rows = [r for r in all_rows if r[MEM_PEAK] is not None]
        peaks = _values(rows, MEM_PEAK)
        over = [r for r in rows if _over_request(r)]
        out.append(
            {
                "node": node,
                "tasks": len(rows),
                "peak_p50_bytes": nearest_rank(peaks, 50),
                "peak_max_bytes": _max(peaks),
                "over_request": len(over),
                "excess_max_bytes": _max(r[MEM_PEAK] - r[MEM_REQUESTED] for r in over),
                "oom_killed": sum(1 for r in all_rows if r[MEM_AT_KILL] is not None),
            }
        )
    return out


def retried_kill_places(rows: TraceRows) -> dict[Any, tuple[Any, Any, Any]]:
    """Per task, its largest kill in an attempt Ray ran again: (memory, node, worker) of
    that attempt's mark (``memory_flagged.sql``'s retried_kill)."""
    places: dict[Any, tuple[Any, Any, Any]] = {}
    best: dict[Any, tuple[Any, int, int]] = {}
    for task_id, ts, id_, _, used, node, worker in rows.retried_marks:
        if used is None:
            continue
        key = best.get(task_id)
        if key is None or used > key[0] or (used == key[0] and (ts, id_) < key[1:]):
            best[task_id] = (used, ts, id_)
            places[task_id] = (used, node, worker)
    return places


def memory_flagged(
    latency: Latency, retried_kills: dict[Any, tuple[Any, Any, Any]] | None = None
) -> list[Row]:
    """``memory_flagged.sql``; ``retried_kills``: :func:`retried_kill_places`."""
    out: list[Row] = []
    for r in latency:
        killed = r[MEM_AT_KILL] is not None
        if not killed and not _over_request(r):
            continue
        requested = r[MEM_REQUESTED]
        # The larger of its measured peak and its memory at a kill (an attempt Ray ran
        # again may have been killed using more than the attempt that was measured).
        at_kill = killed and (r[MEM_PEAK] is None or r[MEM_AT_KILL] > r[MEM_PEAK])
        peak = r[MEM_AT_KILL] if at_kill else r[MEM_PEAK]
        has_request = requested is not None and requested > 0
        node, worker = r[NODE], r[WORKER]
        if at_kill and retried_kills:
            place = retried_kills.get(r[TASK_ID])
            if place is not None and place[0] == peak:  # where that kill was, not its retry
                node, worker = place[1], place[2]
        out.append(
            {
                "task_id": r[TASK_ID],
                "attempt": r[ATTEMPT],
                "stage_id": r[STAGE_ID],
                "stage": r[STAGE],
                "node": node,
                "worker": worker,
                "reason": "oom killed" if killed else "over request",
                "requested_bytes": requested,
                "peak_bytes": peak,
                "peak_source": "at kill" if at_kill else r[PEAK_SOURCE],
                "excess_bytes": _sub(peak, requested) if has_request else None,
                "ratio": peak / requested if has_request and peak is not None else None,
            }
        )
    out.sort(
        key=lambda r: (
            r["reason"] != "oom killed",
            r["excess_bytes"] is None,
            -(r["excess_bytes"] or 0),
            _key(r["task_id"]),
            _key(r["attempt"]),
        )
    )
    return out

"""The analyses computed from :func:`tracer.format.read_trace`, without trace_processor.

Each function here mirrors one file of ``tracer/query/sql`` step by step
(same joins, same NULL rules, same nearest-rank percentiles, same ordering),
so that both engines give the same rows; ``tests/query`` checks that they
agree. Rows are dicts; :func:`tracer.query.columns.to_frame` types them.

How trace_processor sees a trace, and so how this module reads the model:
instants are zero-length slices (they count for the trace's end), a slice
left open has ``dur = -1`` (``None`` here), and debug annotations are args
named ``debug.<name>``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

from tracer.format import Slice, TraceModel
from tracer.ray import layout as L

__all__ = [
    "dispatch_loop",
    "executions",
    "latency_by_stage",
    "memory_by_node",
    "memory_by_stage",
    "memory_flagged",
    "nearest_rank",
    "run_info",
    "stage_summary",
    "task_latency",
    "task_latency_rows",
    "tasks",
    "worker_utilisation",
]

Row = dict[str, Any]
_K = TypeVar("_K", bound=Hashable)

#: The dispatch loop's phases, in display order.
PHASES = (
    L.SLICE_PLAN_POLLING,
    L.SLICE_BATCHING,
    L.SLICE_DISPATCHING,
    L.SLICE_AWAITING,
    L.SLICE_NOOP_TASK,
)
GAPS_IN_WAVES = "gaps in waves"
GAPS_BETWEEN_WAVES = "gaps between waves"
_LOOP_NAMES = (L.SLICE_EXECUTION, L.SLICE_WAVE, *PHASES)


# ------------------------------------------------------------------ helpers


def nearest_rank(values: Iterable[int], p: int) -> int | None:
    """The nearest-rank ``p``-th percentile: the value at rank ceil(p * n / 100)."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[(p * len(ordered) + 99) // 100 - 1]


def _sub(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def _coalesce(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _max(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _min(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _key(value: Any) -> tuple[bool, Any]:
    """Sort key that puts None first, as SQLite orders NULL."""
    return (value is not None, value)


def _group(rows: Iterable[Row], key: Callable[[Row], _K]) -> dict[_K, list[Row]]:
    groups: dict[_K, list[Row]] = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    return groups


def _over_request(row: Row) -> bool:
    req, peak = row["memory_requested"], row["memory_peak"]
    return req is not None and peak is not None and req > 0 and peak > req


def _arg(args: dict[str, Any], *path: str) -> Any:
    value: Any = args
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return None if isinstance(value, (dict, list)) else value


def _bytes(args: dict[str, Any], *path: str) -> int | None:
    """A byte amount from the args, or None when it is not a number of bytes.

    tracer.ray writes ints; a trace from elsewhere may hold a string, a bool
    or an infinite float there, which is treated as not measured rather than
    stopping every analysis that compares or sums amounts.
    """
    value = _arg(args, *path)
    if value.__class__ is bool:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


def trace_end(model: TraceModel) -> int | None:
    """The last moment of the trace: ``MAX(ts + MAX(dur, 0))`` over the slice table."""
    ends = [s.ts + (s.dur if s.dur is not None and s.dur > 0 else 0) for s in model.slices]
    ends.extend(i.ts for i in model.instants)
    return max(ends) if ends else None


def trace_start(model: TraceModel) -> int | None:
    starts = [s.ts for s in model.slices]
    starts.extend(i.ts for i in model.instants)
    return min(starts) if starts else None


def _thread_of(model: TraceModel, uuid: int) -> tuple[str | None, str | None]:
    """(node, worker): the process and thread names of the thread a track belongs to."""
    track = model.tracks.get(uuid)
    seen: set[int] = set()
    while track is not None and track.kind != "thread" and track.uuid not in seen:
        seen.add(track.uuid)
        track = model.tracks.get(track.parent_uuid) if track.parent_uuid is not None else None
    if track is None or track.kind != "thread":
        return None, None
    process = model.parent_of(track.uuid)
    node = process.name if process is not None and process.kind == "process" else None
    return node, track.name


# ------------------------------------------------------------- base tables


def tasks(model: TraceModel) -> list[Row]:
    """``tracer_task``: one row per task attempt."""
    dispatched: dict[int, list[Slice]] = defaultdict(list)
    for s in model.slices:
        if (
            s.parent_id is not None
            and s.category == L.CAT_TASK
            and s.name == L.SLICE_DISPATCHED
        ):
            dispatched[s.parent_id].append(s)
    rows: list[Row] = []
    for t in model.slices:
        if t.category != L.CAT_TASK or t.depth != 0:
            continue
        args = t.args
        status = _arg(args, L.ARG_STATUS)
        attempt = _arg(args, L.ARG_ATTEMPT)
        stage = _arg(args, L.ARG_STAGE)
        received = None
        if t.dur is not None and (status or "") not in ("unfinished", "superseded"):
            received = t.ts + t.dur
        base = {
            "slice_id": t.id,
            "task_id": _arg(args, L.ARG_TASK_ID),
            "attempt": 0 if attempt is None else attempt,
            "stage_id": _arg(args, L.ARG_STAGE_ID),
            "stage": t.name if stage is None else stage,
            "status": status,
            "memory_requested": _bytes(args, L.ARG_RESOURCE_REQUEST, "memory_bytes"),
            "memory_at_kill": _bytes(args, L.ARG_MEMORY_AT_KILL),
            "created_ts": t.ts,
            "received_ts": received,
        }
        children: list[Slice | None] = list(dispatched.get(t.id, ())) or [None]
        for d in children:
            rows.append({**base, "dispatched_ts": None if d is None else d.ts})
    return rows


def executions(model: TraceModel) -> list[Row]:
    """``tracer_execution``: one row per task execution measured in a worker."""
    rows: list[Row] = []
    for s in model.slices:
        # model.slices holds no instants: the "task failed" / "task cancelled"
        # marks that tracer_tables.sql leaves out by name are not here.
        if s.category != L.CAT_EXECUTION or s.name is None or s.dur is None:
            continue
        node, worker = _thread_of(model, s.track_uuid)
        peak = _bytes(s.args, L.ARG_MEMORY_PEAK)
        source = None
        if peak is not None:
            source = "heap" if _bytes(s.args, L.ARG_HEAP_PEAK) is not None else "rss"
        rows.append(
            {
                "slice_id": s.id,
                "task_id": _arg(s.args, L.ARG_TASK_ID),
                "stage": s.name,
                "start_ts": s.ts,
                "end_ts": s.ts + s.dur,
                "dur": s.dur,
                "memory_requested": _bytes(s.args, L.ARG_MEMORY_REQUESTED),
                "memory_peak": peak,
                "peak_source": source,
                "status": _arg(s.args, L.ARG_STATUS),
                "node": node,
                "worker": worker,
            }
        )
    return rows


def task_latency_rows(model: TraceModel) -> list[Row]:
    """``tracer_task_latency``: task attempts joined to their execution by ``task_id``."""
    task_rows = tasks(model)
    by_task_id: dict[Any, list[Row]] = defaultdict(list)
    for t in task_rows:
        if t["task_id"] is not None:
            by_task_id[t["task_id"]].append(t)
    # Each execution goes to the latest attempt created before it started.
    chosen: dict[int, list[Row]] = defaultdict(list)
    for e in executions(model):
        candidates = by_task_id.get(e["task_id"]) if e["task_id"] is not None else None
        if not candidates:
            continue
        start = e["start_ts"]

        def order(t: Row, start: int = start) -> tuple[bool, int, int]:
            before = t["created_ts"] <= start
            return (not before, -t["created_ts"] if before else t["created_ts"], t["slice_id"])

        best = min(candidates, key=order)
        chosen[best["slice_id"]].append(e)
    rows: list[Row] = []
    for t in task_rows:
        execs = chosen.get(t["slice_id"])
        m = max(execs, key=lambda e: (e["start_ts"], e["slice_id"])) if execs else None
        get: Callable[[str], Any] = (lambda k: None) if m is None else m.get
        started, finished = get("start_ts"), get("end_ts")
        requested = get("memory_requested")
        rows.append(
            {
                "task_id": t["task_id"],
                "attempt": t["attempt"],
                "stage_id": t["stage_id"],
                "stage": t["stage"],
                "status": _coalesce(t["status"], get("status"), "ok"),
                "node": get("node"),
                "worker": get("worker"),
                "created_ts": t["created_ts"],
                "dispatched_ts": t["dispatched_ts"],
                "started_ts": started,
                "finished_ts": finished,
                "received_ts": t["received_ts"],
                "waiting_ns": _sub(t["dispatched_ts"], t["created_ts"]),
                "scheduling_ns": _sub(started, t["dispatched_ts"]),
                "running_ns": _sub(finished, started),
                "pickup_ns": _sub(t["received_ts"], finished),
                "total_ns": _sub(t["received_ts"], t["created_ts"]),
                "memory_requested": t["memory_requested"] if requested is None else requested,
                "memory_peak": get("memory_peak"),
                "peak_source": get("peak_source"),
                "memory_at_kill": t["memory_at_kill"],
                "task_slice_id": t["slice_id"],
                "execution_slice_id": get("slice_id"),
            }
        )
    return rows


def run_info(model: TraceModel) -> Row:
    """``execution_id``, ``runner`` and ``tracing_level`` from the loop's first execution slice."""
    for s in model.slices:
        if s.category == L.CAT_SCHEDULER and s.name == L.SLICE_EXECUTION and s.depth == 0:
            return {k: _arg(s.args, k) for k in ("execution_id", "runner", "tracing_level")}
    return {}


# ---------------------------------------------------------------- analyses
#
# Each takes the model, and optionally the rows of task_latency_rows(model)
# already computed (TraceQuery computes them once for all analyses).


def _latency(model: TraceModel, latency: list[Row] | None) -> list[Row]:
    return latency if latency is not None else task_latency_rows(model)



def task_latency(model: TraceModel, latency: list[Row] | None = None) -> list[Row]:
    """``task_latency.sql``."""
    rows = list(latency if latency is not None else task_latency_rows(model))
    rows.sort(key=lambda r: (_key(r["created_ts"]), _key(r["task_id"]), _key(r["attempt"])))
    return rows


def _by_stage(rows: list[Row]) -> list[tuple[Any, list[Row]]]:
    groups = _group(rows, lambda r: r["stage_id"])
    return sorted(groups.items(), key=lambda kv: _key(kv[0]))


def _values(rows: list[Row], column: str) -> list[int]:
    return [r[column] for r in rows if r[column] is not None]


def stage_summary(model: TraceModel, latency: list[Row] | None = None) -> list[Row]:
    """``stage_summary.sql``."""
    out: list[Row] = []
    for stage_id, rows in _by_stage(_latency(model, latency)):
        durs = _values(rows, "running_ns")
        peaks = _values(rows, "memory_peak")
        out.append(
            {
                "stage_id": stage_id,
                "stage": _min(r["stage"] for r in rows),
                "tasks": len(rows),
                "failed": sum(1 for r in rows if r["status"] == "failed"),
                "wall_ns": _sub(
                    _max(r["received_ts"] for r in rows), _min(r["created_ts"] for r in rows)
                ),
                "dur_p50_ns": nearest_rank(durs, 50),
                "dur_p95_ns": nearest_rank(durs, 95),
                "dur_max_ns": _max(durs),
                "memory_requested": _max(r["memory_requested"] for r in rows),
                "peak_p50_bytes": nearest_rank(peaks, 50),
                "peak_max_bytes": _max(peaks),
                "over_request": sum(1 for r in rows if _over_request(r)),
            }
        )
    return out


def latency_by_stage(model: TraceModel, latency: list[Row] | None = None) -> list[Row]:
    """``latency_by_stage.sql``."""
    out: list[Row] = []
    for stage_id, rows in _by_stage(_latency(model, latency)):
        row: Row = {
            "stage_id": stage_id,
            "stage": _min(r["stage"] for r in rows),
            "tasks": len(rows),
        }
        for phase in ("waiting", "scheduling", "running", "pickup", "total"):
            values = _values(rows, f"{phase}_ns")
            row[f"{phase}_p50_ns"] = nearest_rank(values, 50)
            row[f"{phase}_p95_ns"] = nearest_rank(values, 95)
        out.append(row)
    return out


def dispatch_loop(model: TraceModel) -> list[Row]:
    """``dispatch_loop.sql``."""
    end = trace_end(model)
    names = {s.id: s.name for s in model.slices}
    loop: list[tuple[Slice, int]] = []
    for s in model.slices:
        if s.category == L.CAT_SCHEDULER and s.name in _LOOP_NAMES:
            dur = s.dur if s.dur is not None else (end if end is not None else s.ts) - s.ts
            loop.append((s, dur))
    phases = [(s, dur) for s, dur in loop if s.name in PHASES]
    nested: dict[int, int] = defaultdict(int)
    for s, dur in phases:
        if s.parent_id is not None:
            nested[s.parent_id] += dur
    own = [
        (s.name, names.get(s.parent_id) if s.parent_id is not None else None, dur,
         dur - nested.get(s.id, 0))
        for s, dur in phases
    ]
    span = sum(dur for s, dur in loop if s.name == L.SLICE_EXECUTION)
    waves = sum(dur for s, dur in loop if s.name == L.SLICE_WAVE)
    in_waves = sum(dur for _, parent, dur, _ in own if parent == L.SLICE_WAVE)
    outside = sum(
        dur for _, parent, dur, _ in own if parent is None or parent not in (L.SLICE_WAVE, *PHASES)
    )
    rows: list[tuple[str, int | None, int]] = []
    for phase in PHASES:
        mine = [own_ns for name, _, _, own_ns in own if name == phase]
        if mine:
            rows.append((phase, len(mine), sum(mine)))
    rows.append((GAPS_IN_WAVES, None, waves - in_waves))
    rows.append((GAPS_BETWEEN_WAVES, None, span - waves - outside))
    return [
        {
            "phase": phase,
            "count": count,
            "total_ns": total,
            "mean_ns": None if not count else total / count,
            "share": None if span == 0 else total / span,
        }
        for phase, count, total in rows
    ]


def worker_utilisation(model: TraceModel, buckets: int = 20) -> list[Row]:
    """``worker_utilisation.sql`` with ``buckets`` buckets."""
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
        raise ValueError(f"buckets must be a positive integer, got {buckets!r}")
    execs = executions(model)
    start, end = trace_start(model), trace_end(model)
    if not execs or start is None or end is None:
        return []
    size = max((end - start + buckets - 1) // buckets, 1)
    by_worker = _group(execs, lambda e: (e["node"], e["worker"]))
    out: list[Row] = []
    for (node, worker), mine in sorted(
        by_worker.items(), key=lambda kv: (_key(kv[0][0]), _key(kv[0][1]))
    ):
        for i in range(buckets):
            lo, hi = start + i * size, start + (i + 1) * size
            busy = sum(
                min(e["end_ts"], hi) - max(e["start_ts"], lo)
                for e in mine
                if e["start_ts"] < hi and e["end_ts"] > lo
            )
            out.append(
                {
                    "node": node,
                    "worker": worker,
                    "bucket": i,
                    "start_ns": i * size,
                    "bucket_ns": size,
                    "busy_ns": busy,
                    "busy_fraction": busy / size,
                }
            )
    return out


def memory_by_stage(model: TraceModel, latency: list[Row] | None = None) -> list[Row]:
    """``memory_by_stage.sql``."""
    out: list[Row] = []
    for stage_id, rows in _by_stage(_latency(model, latency)):
        peaks = _values(rows, "memory_peak")
        ratios = [
            r["memory_peak"] / r["memory_requested"]
            for r in rows
            if r["memory_requested"] is not None
            and r["memory_requested"] > 0
            and r["memory_peak"] is not None
        ]
        out.append(
            {
                "stage_id": stage_id,
                "stage": _min(r["stage"] for r in rows),
                "tasks": len(rows),
                "measured": len(peaks),
                "requested_bytes": _max(r["memory_requested"] for r in rows),
                "peak_p50_bytes": nearest_rank(peaks, 50),
                "peak_max_bytes": _max(peaks),
                "over_request": sum(1 for r in rows if _over_request(r)),
                "no_request": sum(
                    1
                    for r in rows
                    if not r["memory_requested"] and r["memory_peak"] is not None
                ),
                "oom_killed": sum(1 for r in rows if r["memory_at_kill"] is not None),
                "peak_to_request_max": _max(ratios),
            }
        )
    return out


def memory_by_node(model: TraceModel, latency: list[Row] | None = None) -> list[Row]:
    """``memory_by_node.sql``."""
    measured = [r for r in _latency(model, latency) if r["memory_peak"] is not None]
    out: list[Row] = []
    groups = _group(measured, lambda r: r["node"])
    for node, rows in sorted(groups.items(), key=lambda kv: _key(kv[0])):
        peaks = _values(rows, "memory_peak")
        over = [r for r in rows if _over_request(r)]
        out.append(
            {
                "node": node,
                "tasks": len(rows),
                "peak_p50_bytes": nearest_rank(peaks, 50),
                "peak_max_bytes": _max(peaks),
                "over_request": len(over),
                "excess_max_bytes": _max(r["memory_peak"] - r["memory_requested"] for r in over),
            }
        )
    return out


def memory_flagged(model: TraceModel, latency: list[Row] | None = None) -> list[Row]:
    """``memory_flagged.sql``."""
    out: list[Row] = []
    for r in _latency(model, latency):
        killed = r["memory_at_kill"] is not None
        if not killed and not _over_request(r):
            continue
        requested = r["memory_requested"]
        peak = _coalesce(r["memory_peak"], r["memory_at_kill"])
        has_request = requested is not None and requested > 0
        out.append(
            {
                "task_id": r["task_id"],
                "attempt": r["attempt"],
                "stage_id": r["stage_id"],
                "stage": r["stage"],
                "node": r["node"],
                "worker": r["worker"],
                "reason": "oom killed" if killed else "over request",
                "requested_bytes": requested,
                "peak_bytes": peak,
                "peak_source": r["peak_source"] if r["memory_peak"] is not None else "at kill",
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

"""The ``memory=`` each stage should request, from what its tasks used: ``memory_suggestions``.

Built only on the public analyses of :class:`~tracer.query.TraceQuery`
(``memory_by_stage``, ``memory_flagged``, ``task_latency``, ``run_info``), so
both engines give the same suggestions. The rule, per stage:

* **suggested** = the stage's largest measured peak x ``headroom`` (default
  1.25), rounded up to a whole MiB (at least 1 MiB: a task with no request
  reserves nothing, which is how clusters overcommit). A task Ray's OOM killer
  killed counts with the memory its worker used at the kill, a lower bound of
  what it needed (the note says so), where that is above its request: killed
  under its request, it was killed for the memory of others (Ray kills
  several workers at once), and a lower bound under the request cannot say
  the request should be lower.
* **tasks per node**: how many tasks of that size Ray would place on one node
  at once by memory alone (CPUs and GPUs may allow fewer): the node's
  ``memory`` resource // the request. The node's size is the trace's
  *available memory* counter at the start of the run (the cluster's
  ``memory`` resource) divided by the nodes that ran tasks, unless
  ``node_memory`` is given: on a cluster of unequal nodes give it.
* **change**: suggested - today's request (the largest request of the stage's
  tasks), and suggested / request.

What a peak is decides what the suggestion means: at level 2 memray's heap
peak of the task (what the task itself allocated, without the worker's own
memory, which is what Ray's docs say ``memory=`` is; the note says so, since
Ray's OOM killer counts the whole process), at level 1 the worker's private RSS
peak (~60-120 MiB of its own in a Ray worker), or its USS peak where the engine
measured one (Ray Data, ~100 MiB); both include that baseline, so the
suggestion is higher by about that much.
``peak_basis`` says which (``"heap"``, ``"rss"``, ``"uss"``, as the largest
peak's ``peak_source`` in ``task_latency``, or ``"at kill"`` when the largest
is a killed task's).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from tracer.query.columns import is_missing, records
from tracer.query.config import DEFAULT_HEADROOM
from tracer.ray import layout as L
from tracer.sizes import InvalidSizeError, parse_size

if TYPE_CHECKING:
    from tracer.query.api import TraceQuery

__all__ = ["DEFAULT_HEADROOM", "SUGGESTION_COLUMNS", "memory_suggestions", "suggested_request"]

_MIB = 1 << 20

#: The columns of :func:`memory_suggestions`, with their pandas dtypes.
SUGGESTION_COLUMNS: dict[str, str] = {
    "stage_id": "Int64",
    "stage": "string",
    "tasks": "Int64",
    "measured": "Int64",
    "oom_killed": "Int64",
    "peak_max_bytes": "Int64",
    "peak_basis": "string",
    "requested_bytes": "Int64",
    "headroom": "float64",
    "suggested_bytes": "Int64",
    "change_bytes": "Int64",
    "change_ratio": "float64",
    "node_memory_bytes": "Int64",
    "tasks_per_node": "Int64",
    "tasks_per_node_now": "Int64",
    "note": "string",
}

_BASIS = {1: "rss", 2: "heap"}


def suggested_request(peak_bytes: int, headroom: float = DEFAULT_HEADROOM) -> int:
    """``peak_bytes`` x ``headroom``, rounded up to a whole MiB (at least 1 MiB)."""
    _check_headroom(headroom)
    if peak_bytes < 0:
        raise ValueError(f"peak_bytes must be >= 0, got {peak_bytes}")
    return max(1, math.ceil(peak_bytes * headroom / _MIB)) * _MIB


def memory_suggestions(
    q: TraceQuery, headroom: float = DEFAULT_HEADROOM, node_memory: int | str | None = None
) -> pd.DataFrame:
    """One row per stage of ``q``'s trace: the request to make; see the module doc."""
    _check_headroom(headroom)
    if node_memory is not None:
        given = node_memory
        what = "node_memory must be a positive size (an int of bytes, or text like '64 GiB')"
        try:
            node_memory = parse_size(given, "node_memory")  # as --node-memory takes it
        except InvalidSizeError as exc:
            raise InvalidSizeError(f"{what}, got {given!r} ({exc})") from None
        if node_memory <= 0:
            raise InvalidSizeError(f"{what}, got {given!r}")
    level = q.run_info().get("tracing_level")
    basis = _BASIS.get(level) if isinstance(level, int) else None
    # What each stage's largest peak is, as task_latency says (Ray Data's level 1: USS).
    sources: dict[Any, tuple[int, str]] = {}
    for row in records(q.task_latency()):
        peak, source = row["memory_peak"], row["peak_source"]
        if is_missing(peak) or is_missing(source):
            continue
        seen = sources.get(row["stage_id"])
        if seen is None or peak > seen[0]:
            sources[row["stage_id"]] = (int(peak), str(source))
    killed_at: dict[Any, int] = {}
    for row in records(q.memory_flagged()):
        if row["reason"] == "oom killed" and row["peak_bytes"] is not None:
            requested = row["requested_bytes"]
            if not is_missing(requested) and requested and row["peak_bytes"] <= requested:
                continue  # killed under its request: see the module doc
            key = row["stage_id"]
            killed_at[key] = max(killed_at.get(key, 0), int(row["peak_bytes"]))
    node_bytes = node_memory if node_memory is not None else _observed_node_memory(q)
    rows = []
    for stage in records(q.memory_by_stage()):
        source = sources.get(stage["stage_id"])
        rows.append(_suggest(stage, killed_at.get(stage["stage_id"]),
                             source[1] if source is not None else basis, headroom, node_bytes))
    frame = pd.DataFrame(
        {c: pd.array([r[c] for r in rows], dtype=t) for c, t in SUGGESTION_COLUMNS.items()},
        columns=list(SUGGESTION_COLUMNS),
    )
    return frame


def _suggest(
    stage: dict[str, Any], killed_at: int | None, basis: str | None, headroom: float,
    node_bytes: int | None,
) -> dict[str, Any]:
    peak = stage["peak_max_bytes"]
    requested = stage["requested_bytes"] or None  # 0: no request
    notes = []
    if killed_at is not None and (peak is None or killed_at > peak):
        peak, basis = killed_at, "at kill"
    if stage["oom_killed"] and killed_at is not None:
        notes.append(
            f"{stage['oom_killed']} task(s) killed by Ray's OOM killer: the peak is at least "
            "their memory at the kill, so this is a lower bound"
        )
    elif stage["oom_killed"]:
        notes.append(
            f"{stage['oom_killed']} task(s) killed by Ray's OOM killer under their request "
            "(for other tasks' memory): not counted"
        )
    if basis in ("rss", "uss"):
        notes.append(
            "level-1 peaks are the worker's private RSS (or USS), including its own "
            "~60-120 MiB")
    elif basis == "heap" and peak is not None:
        notes.append(
            "the task's heap only (Ray's memory= is the heap's, by its docs): the worker "
            "process's own ~60-120 MiB is not in it, and Ray's OOM killer counts the whole "
            "process: add it where nodes run short (a level-1 trace's peaks include it)")
    suggested = change = ratio = per_node = per_node_now = None
    if peak is None:
        notes.insert(0, "no measured task: nothing to suggest from")
    else:
        suggested = suggested_request(int(peak), headroom)
        change = suggested - (requested or 0)
        ratio = suggested / requested if requested else float("nan")
        if node_bytes:
            per_node = node_bytes // suggested
            per_node_now = node_bytes // requested if requested else None
            if per_node == 0:
                notes.append("larger than a node's memory: Ray could never schedule it")
    if requested is None and peak is not None:
        notes.append("no request today: Ray reserves nothing for these tasks")
    return {
        "stage_id": stage["stage_id"],
        "stage": stage["stage"],
        "tasks": stage["tasks"],
        "measured": stage["measured"],
        "oom_killed": stage["oom_killed"],
        "peak_max_bytes": peak,
        "peak_basis": basis,
        "requested_bytes": requested,
        "headroom": float(headroom),
        "suggested_bytes": suggested,
        "change_bytes": change,
        "change_ratio": ratio,
        "node_memory_bytes": node_bytes,
        "tasks_per_node": per_node,
        "tasks_per_node_now": per_node_now,
        "note": "; ".join(notes) or None,
    }


def _check_headroom(headroom: float) -> None:
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)):
        raise ValueError(f"headroom must be a number >= 1, got {headroom!r}")
    if not math.isfinite(headroom) or headroom < 1:
        raise ValueError(
            f"headroom must be a number >= 1 (1.25: 25% above the largest peak), got {headroom!r}"
        )


def _observed_node_memory(q: TraceQuery) -> int | None:
    """The cluster's ``memory`` resource at the start of the run, over the nodes that ran tasks.

    The trace records the cluster's total (the largest sample of its *available
    memory* counter: the first, before any task held memory), not each node's.
    """
    nodes = {
        r["node"] for r in records(q.task_latency()) if not is_missing(r["node"])
    }
    if not nodes:
        return None
    total = _cluster_memory(q)
    if not total:
        return None
    return int(total) // len(nodes)


def _cluster_memory(q: TraceQuery) -> int | None:
    name = L.COUNTER_AVAILABLE_MEMORY
    if q.engine == "trace_processor":
        frame = q.query(
            "SELECT MAX(c.value) AS total FROM counter AS c "
            f"JOIN counter_track AS t ON t.id = c.track_id WHERE t.name = '{name}'"
        )
        value: Any = frame["total"].iloc[0] if len(frame) else None
        return None if is_missing(value) else int(value)
    model = q.model
    values = [
        c.value for uuid, track in model.tracks.items() if track.name == name
        for c in model.counters_on(uuid)
    ]
    return int(max(values)) if values else None

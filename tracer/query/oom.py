"""What Ray's OOM killer saw on a node when it killed: ``oom_reports``.

Ray's report of a kill lists the node's largest processes at that moment
(its top 10: pid, memory, command), and a Ray worker's command names the
task it ran (``ray::MapBatches(hog)``). The producers keep that list on the
killed task's ``task failed`` mark (``layout.ARG_OOM_TOP_MEMORY_USERS``). It
is the one view of memory in flight the trace has: where Ray killed another
task than the one that took the memory (Ray 2.60 kills by the time since a
task started, and several at once), that one's own measurements never come
(it ends ``unfinished``), and only this list shows it.

Every task killed in one round carries the same report: one report per
distinct list on a node, at its first mark. Both engines give the same rows:
trace_processor from the marks' args, the reader from its model of the
trace (read only when the trace has such a mark: it holds the whole trace).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from tracer.query.columns import is_missing, records
from tracer.ray import layout as L

if TYPE_CHECKING:
    from tracer.query.api import TraceQuery

__all__ = ["OOM_REPORT_COLUMNS", "oom_reports"]

#: The columns of :func:`oom_reports`, with their pandas dtypes.
OOM_REPORT_COLUMNS: dict[str, str] = {
    "report": "Int64",
    "ts": "Int64",
    "node": "string",
    "task_id": "string",
    "rank": "Int64",
    "pid": "Int64",
    "memory_bytes": "Int64",
    "command": "string",
}

_KEY = f"debug.{L.ARG_OOM_TOP_MEMORY_USERS}"


def oom_reports(q: TraceQuery) -> pd.DataFrame:
    """One row per process of each OOM report: ``report`` (1, 2, ... in time order), its
    ``ts`` and ``node``, the first killed task that carried it (``task_id``), and the
    process's ``rank`` in it (1: the largest), ``pid``, ``memory_bytes``, ``command``."""
    marks = _marks_tp(q) if q.engine == "trace_processor" else _marks_reader(q)
    rows: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for ts, _, node, task_id, users in sorted(marks, key=lambda m: (m[0], m[1])):
        key = (node, tuple((u["pid"], u["memory"], u["command"]) for u in users))
        if not users or key in seen:
            continue
        seen.add(key)
        report = len(seen)
        for rank, u in enumerate(users, 1):
            rows.append({"report": report, "ts": ts, "node": node, "task_id": task_id,
                         "rank": rank, "pid": u["pid"], "memory_bytes": u["memory"],
                         "command": u["command"]})
    return pd.DataFrame(
        {c: pd.array([r[c] for r in rows], dtype=t) for c, t in OOM_REPORT_COLUMNS.items()},
        columns=list(OOM_REPORT_COLUMNS),
    )


_Mark = tuple[int, int, "str | None", "str | None", list[dict[str, Any]]]


def _marks_tp(q: TraceQuery) -> list[_Mark]:
    name = L.INSTANT_TASK_FAILED.replace("'", "''")
    frame = q.query(f"""
        SELECT s.id, s.ts, a.key, a.int_value, a.string_value,
          EXTRACT_ARG(s.arg_set_id, 'debug.{L.ARG_TASK_ID}') AS task_id,
          CASE WHEN t.name GLOB 'Node *' THEN t.name
               WHEN p.name GLOB 'Node *' THEN p.name END AS node
        FROM slice AS s
        JOIN args AS a ON a.arg_set_id = s.arg_set_id
        JOIN track AS t ON t.id = s.track_id
        LEFT JOIN track AS p ON p.id = t.parent_id
        WHERE s.name = '{name}' AND s.dur = 0 AND a.key GLOB '{_KEY}[[]*'
        ORDER BY s.ts, s.id""")
    by_mark: dict[int, _Mark] = {}
    for r in records(frame):
        mark = by_mark.get(r["id"])
        if mark is None:
            node = None if is_missing(r["node"]) else str(r["node"])
            task_id = None if is_missing(r["task_id"]) else str(r["task_id"])
            mark = by_mark[r["id"]] = (int(r["ts"]), int(r["id"]), node, task_id, [])
        # 'debug.oom_top_memory_users[3].memory': the entry, then its field.
        index_text, _, field = str(r["key"])[len(_KEY) + 1:].partition("].")
        index = int(index_text)
        users = mark[4]
        while len(users) <= index:
            users.append({"pid": None, "memory": None, "command": None})
        value = r["string_value"] if field == "command" else r["int_value"]
        users[index][field] = None if is_missing(value) else value
    return list(by_mark.values())


def _marks_reader(q: TraceQuery) -> list[_Mark]:
    flagged = q.memory_flagged()
    if not (flagged["reason"] == "oom killed").any():
        return []  # no kill: the whole trace is not read
    model = q.model
    out: list[_Mark] = []
    for i in model.instants:
        users = i.args.get(L.ARG_OOM_TOP_MEMORY_USERS) if i.name == L.INSTANT_TASK_FAILED else None
        if not users:
            continue
        node = None
        track = model.tracks.get(i.track_uuid)
        for candidate in (track, model.parent_of(i.track_uuid) if track else None):
            if candidate is not None and (candidate.name or "").startswith("Node "):
                node = candidate.name
                break
        task_id = i.args.get(L.ARG_TASK_ID)
        out.append((i.ts, i.id, node, None if task_id is None else str(task_id),
                    [{"pid": u.get("pid"), "memory": u.get("memory"),
                      "command": u.get("command")} for u in users]))
    return out

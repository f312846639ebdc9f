"""Run tracer's SQL files in plain SQLite, on tables shaped like trace_processor's.

No trace_processor binary can be had on every machine, so this emulates the
few tables the SQL reads, filled from :func:`tracer.format.read_trace` by the
documented import rules (/work/shared/perfetto-format.md, section 2):

* ``slice(id, ts, dur, track_id, category, name, depth, parent_id, arg_set_id)``
  with instants as zero-length slices and open slices at ``dur = -1``;
* ``args(arg_set_id, key, int_value, string_value, real_value)`` with debug
  annotations as ``debug.<name>``, dict entries ``debug.<name>.<key>`` and
  array items ``debug.<name>[i]``, and ``EXTRACT_ARG(arg_set_id, key)``;
* ``thread_track(id, utid)``: thread tracks and the tracks under them;
  ``track(id, name, parent_id)``: every track;
  ``thread(utid, tid, name, upid)``; ``process(upid, pid, name)``.

It checks that the SQL is valid SQLite and computes what the reader engine
computes; it is no proof that trace_processor accepts it (the real check runs
when a binary is available, which CI always has).

The SQL files use PerfettoSQL's standard library. Of it, SQLite gets a
stand-in for one view: ``thread_slice`` (slices.with_context), three joins.
A file that needs more (worker_utilisation.sql's interval intersection, a
trace_processor operator) does not run here: :func:`runs_in_sqlite` says
which, and only trace_processor checks them.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd

from tracer.format import TraceModel, read_trace
from tracer.query.sql import TABLES, sql_text, worker_utilisation_sql

_SANITIZE = re.compile(r"[.\[\]]")
_INCLUDE = re.compile(r"^INCLUDE PERFETTO MODULE ([\w.]+);[ \t]*$", re.MULTILINE)

#: Stand-ins for the standard library modules that SQLite can do without trace_processor.
STAND_INS = {
    "slices.with_context": """
        CREATE VIEW thread_slice AS
        SELECT s.*, th.utid, th.name AS thread_name, th.upid, p.name AS process_name
        FROM slice AS s
        JOIN thread_track AS tt ON tt.id = s.track_id
        JOIN thread AS th ON th.utid = tt.utid
        LEFT JOIN process AS p ON p.upid = th.upid
    """,
}


def runs_in_sqlite(name: str) -> bool:
    """Whether ``sql/<name>.sql`` needs only the standard library modules stood in for here."""
    text = worker_utilisation_sql(20) if name == "worker_utilisation" else sql_text(name)
    return all(module in STAND_INS for module in _INCLUDE.findall(text))


def _sqlite(text: str) -> str:
    """The SQL without its INCLUDE statements (their stand-ins are views of the database)."""
    for module in _INCLUDE.findall(text):
        if module not in STAND_INS:
            raise ValueError(f"no SQLite stand-in for PerfettoSQL module {module}")
    return _INCLUDE.sub("", text)


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{_SANITIZE.sub('_', str(key))}", item, out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _flatten(f"{prefix}[{i}]", item, out)
    elif value is not None:
        out[prefix] = int(value) if isinstance(value, bool) else value


def connect(model: TraceModel) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.executescript(
        """
        CREATE TABLE slice (id INTEGER PRIMARY KEY, ts INT, dur INT, track_id INT,
                            category TEXT, name TEXT, depth INT, parent_id INT, arg_set_id INT);
        CREATE TABLE args (arg_set_id INT, key TEXT, int_value INT, string_value TEXT,
                           real_value REAL);
        CREATE TABLE thread_track (id INT, utid INT);
        CREATE TABLE track (id INT, name TEXT, parent_id INT);
        CREATE TABLE thread (utid INT, tid INT, name TEXT, upid INT);
        CREATE TABLE process (upid INT, pid INT, name TEXT);
        """
    )
    arg_values: dict[int, dict[str, Any]] = {}
    events: list[Any] = [*model.slices, *model.instants]
    for arg_set_id, event in enumerate(sorted(events, key=lambda e: e.id), start=1):
        flat: dict[str, Any] = {}
        for name, value in event.args.items():
            _flatten(f"debug.{_SANITIZE.sub('_', name)}", value, flat)
        arg_values[arg_set_id] = flat
        dur = getattr(event, "dur", 0)
        db.execute(
            "INSERT INTO slice VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (event.id, event.ts, -1 if dur is None else dur, event.track_uuid,
             event.category, event.name, event.depth, event.parent_id, arg_set_id),
        )
        for key, value in flat.items():
            db.execute(
                "INSERT INTO args VALUES (?, ?, ?, ?, ?)",
                (arg_set_id, key,
                 value if isinstance(value, int) else None,
                 value if isinstance(value, str) else None,
                 value if isinstance(value, float) else None),
            )

    def extract_arg(arg_set_id: int | None, key: str) -> Any:
        if arg_set_id is None:
            return None
        return arg_values.get(arg_set_id, {}).get(key)

    db.create_function("EXTRACT_ARG", 2, extract_arg, deterministic=True)

    processes: dict[int, int] = {}
    for track in model.tracks.values():
        if track.kind == "process" and track.pid is not None and track.pid not in processes:
            upid = len(processes) + 1
            processes[track.pid] = upid
            db.execute("INSERT INTO process VALUES (?, ?, ?)", (upid, track.pid, track.name))
    utids: dict[int, int] = {}
    for track in model.tracks.values():
        if track.kind == "thread" and track.pid is not None and track.tid is not None:
            upid = processes.get(track.pid)
            if upid is None:  # trace_processor makes the process, unnamed
                upid = processes[track.pid] = len(processes) + 1
                db.execute("INSERT INTO process VALUES (?, ?, NULL)", (upid, track.pid))
            utid = utids[track.uuid] = len(utids) + 1
            db.execute("INSERT INTO thread VALUES (?, ?, ?, ?)",
                       (utid, track.tid, track.name, upid))
    for track in model.tracks.values():
        db.execute("INSERT INTO track VALUES (?, ?, ?)",
                   (track.uuid, track.name, track.parent_uuid))
        if track.kind == "counter":
            continue
        current, seen = track, set()
        while current is not None and current.kind != "thread" and current.uuid not in seen:
            seen.add(current.uuid)
            parent = current.parent_uuid
            current = model.tracks.get(parent) if parent is not None else None
        if current is not None and current.uuid in utids:
            db.execute("INSERT INTO thread_track VALUES (?, ?)", (track.uuid, utids[current.uuid]))
    for view in STAND_INS.values():
        db.execute(view)
    db.executescript(_sqlite(sql_text(TABLES)))
    return db


def run(db: sqlite3.Connection, sql: str) -> pd.DataFrame:
    cursor = db.execute(_sqlite(sql))
    columns = [d[0] for d in cursor.description]
    return pd.DataFrame(cursor.fetchall(), columns=columns, dtype=object)


def analysis(db: sqlite3.Connection, name: str, buckets: int = 20) -> pd.DataFrame:
    sql = worker_utilisation_sql(buckets) if name == "worker_utilisation" else sql_text(name)
    return run(db, sql)


def load(path: str | Path) -> sqlite3.Connection:
    return connect(read_trace(path))

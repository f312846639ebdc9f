"""The PerfettoSQL files shipped in ``tracer/query/sql``.

``tracer_tables.sql`` defines the tables (``tracer_task``, ``tracer_execution``,
``tracer_task_latency``) that the analysis files read; run it first. Each
analysis file is one query. Users can read them, copy them and run them in
trace_processor or the Perfetto UI's query page.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.abc import Traversable

__all__ = [
    "ANALYSES", "MAX_BUCKETS", "TABLES", "check_buckets", "sql_path", "sql_text",
    "worker_utilisation_sql",
]

#: The file that defines the tables every analysis uses.
TABLES = "tracer_tables"

#: The analyses, by name; each is ``sql/<name>.sql``.
ANALYSES = (
    "stage_summary",
    "task_latency",
    "latency_by_stage",
    "dispatch_loop",
    "worker_utilisation",
    "memory_by_stage",
    "memory_by_node",
    "memory_flagged",
    "actor_starts",
    "stage_queues",
    "task_failures",
    "task_retries",
)

_BUCKETS = re.compile(r"SELECT \d+ AS buckets")


def sql_text(name: str) -> str:
    """The text of ``sql/<name>.sql`` (``KeyError`` for an unknown name)."""
    if name != TABLES and name not in ANALYSES:
        raise KeyError(f"no SQL file named {name!r}; known: {', '.join((TABLES, *ANALYSES))}")
    return _sql_file(name).read_text("utf-8")


def sql_path(name: str) -> str:
    """Where ``sql/<name>.sql`` is installed, to point users at it."""
    return str(_sql_file(name))


def _sql_file(name: str) -> Traversable:
    # One name per joinpath: Python 3.10's zip-imported packages take no more.
    return resources.files("tracer.query").joinpath("sql").joinpath(f"{name}.sql")


#: The most time buckets a worker timeline may have: each is a value per worker (and
#: a character on a terminal); millions of them would take gigabytes to compute.
MAX_BUCKETS = 10_000


def check_buckets(buckets: object) -> int:
    """``buckets`` if it is a whole number from 1 to :data:`MAX_BUCKETS`, else ValueError."""
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
        raise ValueError(f"buckets must be a positive integer, got {buckets!r}")
    if buckets > MAX_BUCKETS:
        raise ValueError(f"buckets must be at most {MAX_BUCKETS}, got {buckets}")
    return buckets


def worker_utilisation_sql(buckets: int) -> str:
    """``worker_utilisation.sql`` with its ``buckets`` parameter set."""
    check_buckets(buckets)
    text = sql_text("worker_utilisation")
    out, count = _BUCKETS.subn(f"SELECT {buckets} AS buckets", text, count=1)
    if count != 1:  # pragma: no cover - guards an edit of the file
        raise RuntimeError("worker_utilisation.sql lost its `SELECT <n> AS buckets` parameter")
    return out

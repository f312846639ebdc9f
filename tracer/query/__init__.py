"""Answers from a runner trace: ready-made analyses and any SQL.

:class:`TraceQuery` opens a trace written by :mod:`tracer.ray` and answers
with pandas DataFrames:

* :meth:`~TraceQuery.stage_summary`: tasks, wall span, task duration
  p50/p95/max, requested vs actual memory, per stage;
* :meth:`~TraceQuery.task_latency` / :meth:`~TraceQuery.latency_by_stage`:
  created -> dispatched (waiting in the runner), dispatched -> started (Ray
  scheduling), running, finished -> received (result pickup);
* :meth:`~TraceQuery.dispatch_loop`: the loop's time in plan polling,
  batching, dispatching, awaiting, and the gaps between them;
* :meth:`~TraceQuery.worker_utilisation`: busy fraction per worker per time
  bucket;
* :meth:`~TraceQuery.memory_by_stage`, :meth:`~TraceQuery.memory_by_node`,
  :meth:`~TraceQuery.memory_flagged`: tasks whose peak exceeded their request;
* :meth:`~TraceQuery.actor_starts`: per stage run on actors its engine
  started (Ray Data's actor pools), how long they took to start;
* :meth:`~TraceQuery.stage_queues`: per stage whose engine queues its input
  (Ray Data), the most blocks queued at once and the time held back;
* :meth:`~TraceQuery.task_failures`: the task attempts that failed or were
  cancelled, with their errors;
* :meth:`~TraceQuery.task_retries`: the tasks Ray ran more than once, and why
  (an OOM kill Ray retried, with the memory at the kill);
* :meth:`~TraceQuery.memory_suggestions`: the ``memory=`` each stage should
  request (:mod:`tracer.query.suggest`);
* :meth:`~TraceQuery.query`: any SQL, in trace_processor.

The analyses are PerfettoSQL files in ``tracer/query/sql`` (run in
trace_processor with ``engine="trace_processor"``), and the same analyses are
computed in Python (``engine="reader"``) from a streaming read of the trace
(:func:`tracer.format.scan_trace`) that keeps a row per task and per
execution, for machines where no trace_processor binary can be had. The
default, ``engine="auto"``, uses trace_processor when a binary is found.
"""

from typing import TYPE_CHECKING, Any

from tracer.query.columns import SCHEMAS, is_missing, records, to_frame, unique_names
from tracer.query.config import ENGINES, Engine, QueryConfig, check_trace_file, framing_warning
from tracer.query.errors import QueryError, TraceProcessorError, TraceProcessorNotFoundError
from tracer.query.processor import ENV_VAR, find_trace_processor
from tracer.query.sql import ANALYSES, TABLES, sql_path, sql_text

if TYPE_CHECKING:
    from tracer.query.api import TraceQuery


# TraceQuery is loaded on first use: its module brings pandas, the trace reader and
# the analyses (~0.4 s), which the command line's options, `tracer open` and
# `tracer convert` do not need.
def __getattr__(name: str) -> Any:
    if name != "TraceQuery":
        raise AttributeError(f"module 'tracer.query' has no attribute {name!r}")
    from tracer.query.api import TraceQuery

    globals()[name] = TraceQuery  # found once
    return TraceQuery


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"TraceQuery"})


__all__ = [
    "ANALYSES",
    "ENGINES",
    "ENV_VAR",
    "SCHEMAS",
    "TABLES",
    "Engine",
    "QueryConfig",
    "QueryError",
    "TraceProcessorError",
    "TraceProcessorNotFoundError",
    "TraceQuery",
    "check_trace_file",
    "find_trace_processor",
    "framing_warning",
    "is_missing",
    "records",
    "sql_path",
    "sql_text",
    "to_frame",
    "unique_names",
]

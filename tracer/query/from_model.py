"""The reader engine's analyses from a trace read whole (:func:`tracer.format.read_trace`).

:class:`~tracer.query.TraceQuery` streams the trace instead (it keeps a row
per task, not every event: :mod:`tracer.query.collect`); these functions
give the same answers from a :class:`~tracer.format.TraceModel` already in
memory, through the same code (:func:`~tracer.query.collect.rows_from_model`
then :mod:`tracer.query.analyses`). Rows are dicts.
"""

from __future__ import annotations

from typing import Any

from tracer.format import TraceModel
from tracer.query import analyses
from tracer.query.analyses import GAPS_BETWEEN_WAVES, GAPS_IN_WAVES, LATENCY_COLUMNS, nearest_rank
from tracer.query.collect import PHASES, TraceRows, rows_from_model

__all__ = [
    "actor_starts",
    "GAPS_BETWEEN_WAVES",
    "GAPS_IN_WAVES",
    "PHASES",
    "dispatch_loop",
    "latency_by_stage",
    "memory_by_node",
    "memory_by_stage",
    "memory_flagged",
    "nearest_rank",
    "run_info",
    "stage_queues",
    "stage_summary",
    "task_failures",
    "task_latency",
    "task_retries",
    "task_latency_rows",
    "worker_utilisation",
]

Row = dict[str, Any]


def _rows(model: TraceModel) -> TraceRows:
    return rows_from_model(model)


def _latency(model: TraceModel, latency: list[Row] | None) -> analyses.Latency:
    if latency is None:
        return analyses.latency_rows(_rows(model))
    return [tuple(r[c] for c in LATENCY_COLUMNS) for r in latency]


def task_latency_rows(model: TraceModel) -> list[Row]:
    """``tracer_task_latency``: task attempts joined to their execution by ``task_id``."""
    rows = analyses.latency_rows(_rows(model))
    return [dict(zip(LATENCY_COLUMNS, r, strict=True)) for r in rows]


def run_info(model: TraceModel) -> Row:
    """``execution_id``, ``runner`` and ``tracing_level`` from the loop's first execution
    slice, and its ``Ray's events read`` instant's args (see ``TraceQuery.run_info``)."""
    rows = _rows(model)
    return {**rows.run_info, **rows.ray_events_info}


def task_latency(model: TraceModel, latency: list[Row] | None = None) -> list[Row]:
    """``task_latency.sql``."""
    return analyses.task_latency(_latency(model, latency))


def stage_summary(model: TraceModel, latency: list[Row] | None = None) -> list[Row]:
    """``stage_summary.sql``."""
    return analyses.stage_summary(_latency(model, latency))


def latency_by_stage(model: TraceModel, latency: list[Row] | None = None) -> list[Row]:
    """``latency_by_stage.sql``."""
    return analyses.latency_by_stage(_latency(model, latency))


def dispatch_loop(model: TraceModel) -> list[Row]:
    """``dispatch_loop.sql``."""
    return analyses.dispatch_loop(_rows(model))


def worker_utilisation(model: TraceModel, buckets: int = 20) -> list[Row]:
    """``worker_utilisation.sql`` with ``buckets`` buckets."""
    return analyses.worker_utilisation(_rows(model), buckets)


def actor_starts(model: TraceModel) -> list[Row]:
    return analyses.actor_starts(_rows(model))


def stage_queues(model: TraceModel) -> list[Row]:
    return analyses.stage_queues(_rows(model))


def task_failures(model: TraceModel) -> list[Row]:
    return analyses.task_failures(_rows(model))


def task_retries(model: TraceModel) -> list[Row]:
    return analyses.task_retries(_rows(model))


def memory_by_stage(model: TraceModel, latency: list[Row] | None = None) -> list[Row]:
    """``memory_by_stage.sql``."""
    return analyses.memory_by_stage(_latency(model, latency))


def memory_by_node(model: TraceModel, latency: list[Row] | None = None) -> list[Row]:
    """``memory_by_node.sql``."""
    return analyses.memory_by_node(_latency(model, latency))


def memory_flagged(model: TraceModel, latency: list[Row] | None = None) -> list[Row]:
    """``memory_flagged.sql``."""
    return analyses.memory_flagged(
        _latency(model, latency), analyses.retried_kill_places(_rows(model)))

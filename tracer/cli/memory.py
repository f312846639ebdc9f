"""``tracer memory TRACE``: requested vs actual memory per stage and node, and the flagged tasks."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tracer.cli._common import add_trace_args, non_negative_int, open_query
from tracer.cli._output import (
    Column,
    Style,
    fmt_bytes,
    fmt_count,
    fmt_ratio,
    print_json,
    render_table,
)
from tracer.query import QueryConfig, TraceQuery, records

HELP = "requested vs actual memory per stage and node, and the tasks over their request"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "memory",
        help=HELP,
        description=(
            "Compare what tasks asked Ray for (memory=, a reservation Ray never enforces) with "
            "what they used: per stage, per node, and every task whose measured peak exceeded "
            "its request. At tracing level 1 the peak is the worker process's RSS (it includes "
            "the worker's own baseline, ~100 MiB); at level 2 it is memray's heap peak of the "
            "task."
        ),
    )
    add_trace_args(parser)
    parser.add_argument(
        "--limit", type=non_negative_int, default=20,
        help="flagged tasks to list on a terminal, worst first (default 20; 0: all)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (bytes) for machines")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with open_query(args) as q:
        if args.json:
            print_json(
                {
                    "trace": str(args.trace),
                    "engine": q.engine,
                    "run": q.run_info(),
                    "by_stage": records(q.memory_by_stage()),
                    "by_node": records(q.memory_by_node()),
                    "flagged": records(q.memory_flagged()),
                }
            )
            return 0
        print(_render(q, str(args.trace), Style.for_stream(sys.stdout), args.limit))
    return 0


def memory_report(
    trace: str | os.PathLike[str], *, limit: int = 20, config: QueryConfig | None = None
) -> str:
    """What ``tracer memory TRACE`` prints, as plain text, for scripts and examples.

    The same tables from the same analyses (:meth:`TraceQuery.memory_by_stage`
    and friends), so a script's report and the command's never disagree.
    ``limit`` caps the flagged tasks listed (0: all; negative: ValueError).
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0 (0 lists all), got {limit}")
    with TraceQuery(trace, config) as q:
        return _render(q, str(trace), Style(rich=False, color=False), limit)


def _render(q: TraceQuery, trace: str, style: Style, limit: int) -> str:
    info = q.run_info()
    by_stage = q.memory_by_stage()
    by_node = q.memory_by_node()
    flagged = q.memory_flagged()
    engine = q.engine
    level = info.get("tracing_level")
    measured = {
        1: "peak = the worker's RSS peak (level 1; includes the worker's own ~100 MiB)",
        2: "peak = memray's heap peak of the task (level 2; RSS where memray was unavailable)",
    }.get(level if isinstance(level, int) else -1, "peak = the measured peak")
    parts = [
        style.bold(f"Trace {trace}") + "  " + style.dim(f"{measured}; engine {engine}"),
        render_table(
            "Requested vs actual, by stage",
            [
                Column("id", "stage_id", fmt_count),
                Column("stage", "stage", right=False),
                Column("tasks", "tasks", fmt_count),
                Column("measured", "measured", fmt_count),
                Column("requested", "requested_bytes", fmt_bytes),
                Column("peak p50", "peak_p50_bytes", fmt_bytes),
                Column("peak max", "peak_max_bytes", fmt_bytes),
                Column("over request", "over_request", fmt_count),
                Column("no request", "no_request", fmt_count),
                Column("oom killed", "oom_killed", fmt_count),
                Column("worst peak/request", "peak_to_request_max", fmt_ratio),
            ],
            records(by_stage),
            style,
            empty="(no tasks in this trace)",
        ),
        render_table(
            "By node",
            [
                Column("node", "node", right=False),
                Column("tasks", "tasks", fmt_count),
                Column("peak p50", "peak_p50_bytes", fmt_bytes),
                Column("peak max", "peak_max_bytes", fmt_bytes),
                Column("over request", "over_request", fmt_count),
                Column("worst excess", "excess_max_bytes", fmt_bytes),
            ],
            records(by_node),
            style,
            empty="(no measured tasks)",
        ),
    ]
    rows = records(flagged)
    shown = rows if limit <= 0 else rows[:limit]
    title = f"Tasks over their memory request, or killed for memory: {len(rows)}"
    if len(shown) < len(rows):
        title += f" (the worst {len(shown)}; --limit 0 lists all)"
    parts.append(
        render_table(
            title,
            [
                Column("task", "task_id", right=False),
                Column("attempt", "attempt", fmt_count),
                Column("stage", "stage", right=False),
                Column("node", "node", right=False),
                Column("worker", "worker", right=False),
                Column("reason", "reason", right=False),
                Column("requested", "requested_bytes", fmt_bytes),
                Column("peak", "peak_bytes", fmt_bytes),
                Column("peak of", "peak_source", right=False),
                Column("excess", "excess_bytes", fmt_bytes),
                Column("peak/request", "ratio", fmt_ratio),
            ],
            shown,
            style,
            empty="(none: every measured task stayed within its request)",
        )
    )
    return "\n\n".join(parts)

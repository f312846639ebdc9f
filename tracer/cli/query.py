"""``tracer query TRACE SQL``: any SQL over the trace, in trace_processor."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tracer.cli._common import add_trace_args, open_query
from tracer.cli._output import Style, print_json, render_csv, render_frame
from tracer.query import records

HELP = "run any SQL on the trace in trace_processor (needs a trace_processor binary)"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "query",
        help=HELP,
        description=(
            "Run PerfettoSQL on the trace in trace_processor and print the result of its last "
            "statement. The tables tracer_task, tracer_execution and tracer_task_latency, and "
            "of Ray's events tracer_ray_span, tracer_ray_state and tracer_ray_match "
            "(tracer/query/sql/tracer_tables.sql) are defined first. Debug annotations are "
            "args named 'debug.<name>': EXTRACT_ARG(arg_set_id, 'debug.task_id')."
        ),
    )
    add_trace_args(parser, engine=False)
    parser.add_argument("sql", metavar="SQL", help="the query; '-' reads it from stdin")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV")
    fmt.add_argument("--json", action="store_true", help="print JSON (a list of rows)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    sql = sys.stdin.read() if args.sql == "-" else args.sql
    if not sql.strip():
        raise _empty()
    with open_query(args, engine="trace_processor") as q:
        frame = q.query(sql)
    if args.json:
        print_json(records(frame))
    elif args.csv:
        sys.stdout.write(render_csv(frame))
    else:
        print(render_frame(frame, Style.for_stream(sys.stdout)))
    return 0


def _empty() -> Exception:
    from tracer.query import QueryError

    return QueryError("the SQL is empty")

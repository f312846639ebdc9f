"""``tracer memory TRACE``: requested vs actual memory per stage and node, and the flagged tasks;
with ``--suggest``, the memory each stage should request."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from tracer.cli._common import add_trace_args, non_negative_int, open_query, warn
from tracer.cli._output import (
    Column,
    Style,
    fmt_bytes,
    fmt_count,
    fmt_ratio,
    name_column,
    print_json,
    render_table,
)
from tracer.query import QueryConfig, is_missing, records
from tracer.query.config import DEFAULT_HEADROOM
from tracer.sizes import InvalidSizeError, parse_size

if TYPE_CHECKING:
    from tracer.query import TraceQuery

HELP = "requested vs actual memory per stage and node, and the tasks over their request"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "memory",
        help=HELP,
        description=(
            "Compare what tasks asked Ray for (memory=, a reservation Ray never enforces) with "
            "what they used: per stage, per node, and every task whose measured peak exceeded "
            "its request. At tracing level 1 the peak is the worker process's private RSS "
            "(RSS less shared memory: not the object store's pages), or its USS where the "
            "engine measured a larger one (Ray Data); both include the worker's own baseline, "
            "~60-120 MiB; at level 2 it is memray's heap peak of the task."
        ),
    )
    add_trace_args(parser)
    parser.add_argument(
        "--limit", type=non_negative_int, default=20,
        help="flagged tasks to list in the table, worst first (default 20; 0: all; --json "
        "lists all)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (bytes) for machines")
    parser.add_argument(
        "--suggest", action="store_true",
        help="also suggest each stage's memory request: its largest measured peak x the "
        "headroom, rounded up to a MiB, with how many such tasks fit a node",
    )
    parser.add_argument(
        "--headroom", type=_headroom, default=None, metavar="X",
        help=f"the factor above the largest peak (default {DEFAULT_HEADROOM}); implies --suggest",
    )
    parser.add_argument(
        "--node-memory", type=_size, default=None, metavar="SIZE",
        help="a node's memory resource, e.g. '64 GiB' (default: the cluster's, from the "
        "trace, over the nodes that ran tasks); implies --suggest",
    )
    parser.set_defaults(run=run)


def _headroom(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 1 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 1, got {text!r}")
    return value


def _size(text: str) -> int:
    try:
        value = parse_size(text, "node memory")
    except InvalidSizeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 bytes, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    headroom = DEFAULT_HEADROOM if args.headroom is None else args.headroom
    suggest = args.suggest or args.headroom is not None or args.node_memory is not None
    with open_query(args) as q:
        if (
            q.memory_by_stage().empty
            and q.run_info()["execution_id"] is None
            and not q.warnings()
        ):
            warn(f"{args.trace} has no tasks and no run: was it written by tracer.ray?")
        if args.json:
            data = {
                "trace": str(args.trace),
                "engine": q.engine,
                "run": q.run_info(),
                "by_stage": records(q.memory_by_stage()),
                "by_node": records(q.memory_by_node()),
                "flagged": records(q.memory_flagged()),
                "oom_reports": records(q.oom_reports()),
            }
            if suggest:
                data["suggestions"] = records(q.memory_suggestions(headroom, args.node_memory))
            print_json(data)
            return 0
        style = Style.for_stream(sys.stdout)
        text = _render(q, str(args.trace), style, args.limit)
        if suggest:
            text += "\n\n" + _render_suggestions(q, style, headroom, args.node_memory)
        print(text)
    return 0


def memory_report(
    trace: str | os.PathLike[str],
    *,
    limit: int = 20,
    config: QueryConfig | None = None,
    suggest: bool = False,
    headroom: float = DEFAULT_HEADROOM,
    node_memory: int | None = None,
) -> str:
    """What ``tracer memory TRACE`` prints, as plain text, for scripts and examples.

    The same tables from the same analyses (:meth:`TraceQuery.memory_by_stage`
    and friends), so a script's report and the command's never disagree.
    ``limit`` caps the flagged tasks listed (0: all; negative: ValueError).
    ``suggest`` adds ``--suggest``'s table (:meth:`TraceQuery.memory_suggestions`).
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0 (0 lists all), got {limit}")
    from tracer.query import TraceQuery

    style = Style(rich=False, color=False)
    with TraceQuery(trace, config) as q:
        text = _render(q, str(trace), style, limit)
        if suggest:
            text += "\n\n" + _render_suggestions(q, style, headroom, node_memory)
        return text


def _fmt_change(n: Any, style: Style) -> str:
    text = fmt_bytes(n, style)
    return text if is_missing(n) or int(n) <= 0 else "+" + text


def _render_suggestions(
    q: TraceQuery, style: Style, headroom: float, node_memory: int | None
) -> str:
    rows = records(q.memory_suggestions(headroom, node_memory))
    node = next((r["node_memory_bytes"] for r in rows if r["node_memory_bytes"]), None)
    # Each note once, under the table, numbered; a row names its notes' numbers (the same
    # ~230-character note on every stage made each line 400 columns wide).
    notes: dict[str, int] = {}
    for row in rows:
        marks = []
        for note in str(row["note"] or "").split("; "):
            if note:
                marks.append(str(notes.setdefault(note, len(notes) + 1)))
        row["notes"] = ", ".join(marks) or None
    if node_memory is not None:
        where = f"a node's memory: {fmt_bytes(node, style)} (--node-memory)"
    elif node is not None:
        where = (
            f"a node's memory: {fmt_bytes(node, style)}, the cluster's memory resource over "
            "the nodes that ran tasks (--node-memory to set it)"
        )
    else:
        where = "a node's memory: unknown (--node-memory to set it)"
    title = (
        f"Suggested memory request per stage: the largest peak x {headroom:g}, "
        "rounded up to a MiB"
    )
    noted = "".join(f"\nnote {n}: {note}" for note, n in notes.items())
    footer = noted + "\n" + style.dim(
        f"per node: how many such tasks fit one node by memory alone (CPUs may allow fewer); "
        f"{where}\nset it in bytes: memory= in Ray's .options() or @ray.remote and in Ray "
        "Data's map_batches, memory_bytes= in Daft's @daft.udf (Daft sets its other "
        "stages' requests itself), Stage(memory_bytes=) in tracer's runner"
    )
    return render_table(
        title,
        [
            Column("id", "stage_id", fmt_count),
            name_column("stage", "stage"),
            Column("measured", "measured", fmt_count),
            Column("peak max", "peak_max_bytes", fmt_bytes),
            Column("peak of", "peak_basis", right=False),
            Column("requested", "requested_bytes", fmt_bytes),
            Column("suggested", "suggested_bytes", fmt_bytes),
            Column("= bytes", "suggested_bytes", fmt_count),  # what memory= takes
            Column("change", "change_bytes", _fmt_change),
            Column("x request", "change_ratio", fmt_ratio),
            Column("per node now", "tasks_per_node_now", fmt_count),
            Column("per node", "tasks_per_node", fmt_count),
            Column("notes", "notes", right=False),
        ],
        rows,
        style,
        empty="(no tasks in this trace)",
    ) + footer


def _none_flagged(stages: list[dict[str, Any]]) -> str:
    """Why no task is flagged: within its request, or nothing was compared."""
    if not any(r["measured"] for r in stages):
        return "(none: no task was measured)"
    if not any(r["requested_bytes"] for r in stages):
        return "(none: no task requested memory, so none could exceed a request)"
    if any(r["no_request"] for r in stages):
        return ("(none: every measured task that requested memory stayed within it; "
                "tasks with no request are counted under 'no request')")
    return "(none: every measured task stayed within its request)"


def _render(q: TraceQuery, trace: str, style: Style, limit: int) -> str:
    info = q.run_info()
    by_stage = q.memory_by_stage()
    by_node = q.memory_by_node()
    flagged = q.memory_flagged()
    engine = q.engine
    level = info.get("tracing_level")
    measured = {
        1: "peak = the worker's private RSS peak, or USS where the engine measured more "
        "(level 1; includes the worker's own ~60-120 MiB)",
        2: "peak = memray's heap peak of the task (level 2; RSS where memray was unavailable)",
    }.get(level if isinstance(level, int) else -1, "peak = the measured peak")
    parts = [
        style.bold(f"Trace {trace}") + "  " + style.dim(f"{measured}; engine {engine}"),
        render_table(
            "Requested vs actual, by stage",
            [
                Column("id", "stage_id", fmt_count),
                name_column("stage", "stage"),
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
                name_column("node", "node"),
                Column("tasks", "tasks", fmt_count),
                Column("peak p50", "peak_p50_bytes", fmt_bytes),
                Column("peak max", "peak_max_bytes", fmt_bytes),
                Column("over request", "over_request", fmt_count),
                Column("worst excess", "excess_max_bytes", fmt_bytes),
                Column("oom killed", "oom_killed", fmt_count),
            ],
            records(by_node),
            style,
            empty="(no measured or killed tasks)",
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
                name_column("task", "task_id"),
                Column("attempt", "attempt", fmt_count),
                name_column("stage", "stage"),
                name_column("node", "node"),
                name_column("worker", "worker"),
                Column("reason", "reason", right=False),
                Column("requested", "requested_bytes", fmt_bytes),
                Column("peak", "peak_bytes", fmt_bytes),
                Column("peak of", "peak_source", right=False),
                Column("excess", "excess_bytes", fmt_bytes),
                Column("peak/request", "ratio", fmt_ratio),
            ],
            shown,
            style,
            empty=_none_flagged(records(by_stage)),
        )
    )
    if any(r["reason"] == "oom killed" for r in rows):
        reports = _render_oom_reports(q, style)
        if reports:
            parts.append(reports)
    return "\n\n".join(parts)


#: Of Ray's OOM reports, how many are shown, and how many processes of each.
_REPORTS_SHOWN = 3
_PROCESSES_SHOWN = 5


def _render_oom_reports(q: TraceQuery, style: Style) -> str:
    """The largest processes on the node at each kill, as Ray's report lists them: the
    task that took the memory shows there even where Ray killed another."""
    rows = records(q.oom_reports())
    if not rows:
        return ""
    reports: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        reports.setdefault(int(r["report"]), []).append(r)
    out = []
    for number, procs in list(reports.items())[:_REPORTS_SHOWN]:
        head = procs[0]
        title = (f"Ray's OOM report {number} of {len(reports)} ({head['node'] or 'node?'}, "
                 f"task {head['task_id']}'s kill): the node's largest processes")
        out.append(render_table(
            title,
            [
                Column("#", "rank", fmt_count),
                Column("memory", "memory_bytes", fmt_bytes),
                Column("pid", "pid", fmt_count),
                name_column("process (a Ray worker: ray::<what it ran>)", "command"),
            ],
            procs[:_PROCESSES_SHOWN],
            style,
        ))
    more = (f"; {len(reports) - _REPORTS_SHOWN} more reports" if len(reports) > _REPORTS_SHOWN
            else "")
    out.append(style.dim(
        f"the top {_PROCESSES_SHOWN} of each report{more}: all of them with --json or "
        "TraceQuery.oom_reports()"))
    return "\n".join(out)

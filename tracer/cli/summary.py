"""``tracer summary TRACE``: stages, task latency, the dispatch loop and the workers."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from tracer.cli._common import add_trace_args, bucket_count, open_query, warn
from tracer.cli._output import (
    Column,
    Style,
    fmt_bytes,
    fmt_count,
    fmt_dur,
    fmt_name,
    fmt_share,
    name_column,
    print_json,
    render_table,
    sparkline,
)
from tracer.query import is_missing, records
from tracer.ray import layout as L
from tracer.ray.driver_gc import MIN_PAUSE_NS

if TYPE_CHECKING:
    import pandas as pd

    from tracer.query import TraceQuery

HELP = "stages, task latency, dispatch loop and workers of a traced run"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "summary",
        help=HELP,
        description=(
            "Summarise a traced run: per stage (tasks, wall time, task duration "
            "p50/p95/max, memory requested vs peak), where task latency goes (waiting in "
            "the runner, Ray scheduling, running, result pickup; inside scheduling and pickup, "
            "Ray's parts when the trace has Ray's events), where the dispatch loop's "
            "time goes, and how busy each worker was. Durations are wall-clock."
        ),
    )
    add_trace_args(parser)
    parser.add_argument(
        "--buckets", type=bucket_count, default=20,
        help="time buckets of the worker timeline (default 20, at most 10000)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (ns, bytes) for machines")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with open_query(args) as q:
        info = q.run_info()
        stages = q.stage_summary()
        actors = q.actor_starts()
        queues = q.stage_queues()
        failures = q.task_failures()
        retries = q.task_retries()
        latency = q.latency_by_stage()
        loop = q.dispatch_loop()
        util = q.worker_utilisation(args.buckets)
        killed = [(r["stage"], r["oom_killed"]) for r in records(q.memory_by_stage())
                  if r["oom_killed"]]
        largest = _largest_at_a_kill(q) if killed else None
        tasks = q.task_latency()
        # (counted in pandas: a row per task, a million in a big trace)
        unfinished = tasks[tasks["status"] == L.STATUS_UNFINISHED].groupby(
            "stage", sort=False).size()
        engine = q.engine
        warned = bool(q.warnings())
    if stages.empty and loop["count"].isna().all() and not warned:
        warn(f"{args.trace} has no tasks and no dispatch loop: was it written by tracer.ray? "
             "(a Ray timeline made by `tracer convert` has Ray's tasks and phases only: "
             "`tracer open` shows them, `tracer query` answers SQL on them)")
    if args.json:
        print_json(
            {
                "trace": str(args.trace),
                "engine": engine,
                "run": info,
                "stages": records(stages),
                "actor_starts": records(actors),
                "stage_queues": records(queues),
                "task_failures": records(failures),
                "task_retries": records(retries),
                "latency_by_stage": records(latency),
                "dispatch_loop": records(loop),
                "worker_utilisation": records(util),
            }
        )
        return 0
    style = Style.for_stream(sys.stdout)
    print(render(args.trace, engine, info, stages, latency, loop, util, style, killed,
                 largest, [(str(s), int(n)) for s, n in unfinished.items()], actors, queues,
                 failures, retries))
    return 0


def _error_line(error_type: Any, error: Any) -> str:
    """``type: text`` on one line, the type said once where the text starts with it too
    (Ray Data's errors: "ValueError: ..." of type ValueError)."""
    kind = str(error_type or "")
    text = " ".join(str(error or "").split())
    if kind and text.startswith(f"{kind}: "):
        text = text[len(kind) + 2:]
    return f"{kind}: {text}" if kind and text else kind or text


#: The retried tasks the summary lists (all are in --json and TraceQuery.task_retries()).
RETRIES_SHOWN = 10


def _retries(retries: pd.DataFrame, style: Style) -> str:
    """Which tasks Ray ran again, and why: an OOM kill that Ray retried was nowhere in the
    summary (its run looked slow in Ray's queue, and its memory fine)."""
    rows = []
    every = records(retries)
    for row in every[:RETRIES_SHOWN]:
        why = str(row["error_type"] or "")
        if row["memory_at_kill"] is not None:
            why = f"{why} at {fmt_bytes(row['memory_at_kill'], style)}"
        if not why and row["unmeasured_attempts"]:
            why = "not measured (its worker died: crashed, killed or lost with its node)"
        where = " ".join(str(p) for p in (row["failed_node"], row["failed_worker"]) if p)
        rows.append({**row, "why": why or "-", "where": where or None})
    shown = f"the first {RETRIES_SHOWN} of {len(retries)}" if len(retries) > len(rows) \
        else f"{len(rows)}"
    lost = [r["lost_ns"] for r in every if r["lost_ns"] is not None]
    notes = []
    if lost:
        notes.append(f"The failed attempts seen ran {fmt_dur(sum(lost), style)} in all before "
                     "they failed (work done again).")
    if any(r["status"] == "ok" for r in rows):
        notes.append("A retried task's scheduling time includes its attempts that failed.")
    return render_table(
        f"Retried tasks: Ray ran them again ({shown}; --json has them all)",
        [
            name_column("task", "task_id"),
            name_column("stage", "stage"),
            Column("status", "status", right=False),
            Column("attempts", "ray_attempts", fmt_count),
            Column("why the first failed attempt failed", "why", right=False, max_width=80),
            name_column("where", "where"),
            Column("lost", "lost_ns", fmt_dur),
            name_column("ran last on", "node"),
        ],
        rows,
        style,
    ) + "".join("\n" + n for n in notes)


#: The failed tasks the summary lists (all are in --json and TraceQuery.task_failures()).
FAILURES_SHOWN = 10


def _failures(failures: pd.DataFrame, style: Style) -> str:
    """Which tasks failed and why: the Stages table counts them only (a fresh user could
    not tell which task failed, nor of what)."""
    rows = []
    for row in records(failures)[:FAILURES_SHOWN]:
        first = str(row["error"] or "").split("\n", 1)[0]
        rows.append({**row, "why": _error_line(row["error_type"], first)})
    shown = f"the first {FAILURES_SHOWN} of {len(failures)}" if len(failures) > len(rows) \
        else f"{len(rows)}"
    return render_table(
        f"Failed tasks ({shown}; --json has them all)",
        [
            name_column("task", "task_id"),
            Column("attempt", "attempt", fmt_count),
            name_column("stage", "stage"),
            Column("status", "status", right=False),
            Column("error", "why", right=False, max_width=100),
        ],
        rows,
        style,
    )


def _largest_at_a_kill(q: TraceQuery) -> dict[str, Any] | None:
    """The Ray worker using the most memory in any of Ray's OOM reports (its command names
    what it ran): what took the memory, even where Ray killed another task."""
    workers = [r for r in records(q.oom_reports())
               if str(r["command"]).startswith("ray::") and r["memory_bytes"] is not None
               and str(r["command"]).split()[0] not in RAY_OWN_PROCESSES]
    return max(workers, key=lambda r: r["memory_bytes"], default=None)


#: Ray's own processes named ``ray::`` like its workers, which run no task: where a kill
#: came early, the largest of a report was Ray's dashboard agent (fresh user's review 6).
RAY_OWN_PROCESSES = frozenset({
    "ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::IDLE", "ray::IDLE_SPILL_WORKER",
    "ray::IDLE_RESTORE_WORKER", "ray::_StatsActor",
})


#: Ray's parts of scheduling and pickup (tracer_tables.sql), with their column titles.
RAY_PARTS = (
    ("sched_queue", "queue"),
    ("sched_push", "push"),
    ("sched_args", "args"),
    ("sched_start", "start"),
    ("pickup_store", "store"),
    ("pickup_notify", "notify"),
    ("pickup_loop", "loop"),
)


def _ray_parts(latency: pd.DataFrame, style: Style) -> list[str]:
    """Scheduling and pickup split at Ray's events, when the trace has them."""
    rows = []
    for row in records(latency):
        if all(row.get(f"{part}_p50_ns") is None for part, _ in RAY_PARTS):
            continue
        out = {"stage_id": row["stage_id"], "stage": row["stage"]}
        for part, _ in RAY_PARTS:
            p50 = fmt_dur(row[f"{part}_p50_ns"], style)
            p95 = fmt_dur(row[f"{part}_p95_ns"], style)
            out[part] = f"{p50} / {p95}"
        rows.append(out)
    if not rows:
        return []
    return [
        render_table(
            "Inside scheduling and pickup, from Ray's events (p50 / p95): scheduling = "
            "queue (args, worker lease) + push (to the worker) + args (fetch, "
            "deserialize) + start; pickup = store (outputs) + notify (the owner) + loop "
            "(until the runner saw it)",
            [
                Column("id", "stage_id", fmt_count),
                name_column("stage", "stage"),
                *(Column(title, part) for part, title in RAY_PARTS),
            ],
            rows,
            style,
        )
    ]


def render(
    trace: str,
    engine: str,
    info: dict[str, Any],
    stages: pd.DataFrame,
    latency: pd.DataFrame,
    loop: pd.DataFrame,
    util: pd.DataFrame,
    style: Style,
    oom_killed: list[tuple[str, int]] | None = None,
    largest_at_kill: dict[str, Any] | None = None,
    unfinished: list[tuple[str, int]] | None = None,
    actors: pd.DataFrame | None = None,
    queues: pd.DataFrame | None = None,
    failures: pd.DataFrame | None = None,
    retries: pd.DataFrame | None = None,
) -> str:
    """The summary as text; ``oom_killed``: tasks Ray's OOM killer killed, by stage;
    ``largest_at_kill``: the Ray worker using the most memory at a kill (a row of
    :meth:`~tracer.query.TraceQuery.oom_reports`); ``unfinished``: tasks still in
    flight when the trace ended, by stage; ``actors``: the stages' actors starting
    (:meth:`~tracer.query.TraceQuery.actor_starts`); ``queues``: the stages' queued
    blocks and backpressure (:meth:`~tracer.query.TraceQuery.stage_queues`); ``failures``:
    the task attempts that failed or were cancelled
    (:meth:`~tracer.query.TraceQuery.task_failures`); ``retries``: the tasks Ray ran
    again (:meth:`~tracer.query.TraceQuery.task_retries`)."""
    stage_rows = records(stages)
    parts = [_header(trace, engine, info, style)]
    parts.append(
        render_table(
            "Stages",
            [
                Column("id", "stage_id", fmt_count),
                name_column("stage", "stage"),
                Column("tasks", "tasks", fmt_count),
                Column("failed", "failed", fmt_count),
                Column("wall", "wall_ns", fmt_dur),
                Column("dur p50", "dur_p50_ns", fmt_dur),
                Column("dur p95", "dur_p95_ns", fmt_dur),
                Column("dur max", "dur_max_ns", fmt_dur),
                Column("mem requested", "memory_requested", fmt_bytes),
                Column("peak p50", "peak_p50_bytes", fmt_bytes),
                Column("peak max", "peak_max_bytes", fmt_bytes),
                Column("over request", "over_request", fmt_count),
            ],
            stage_rows,
            style,
            empty="(no tasks in this trace)",
        )
    )
    if info.get("tracing_level") == 1 and any(
            r["over_request"] and r["memory_requested"] for r in stage_rows):
        # (a level-1 peak is the worker's, its own memory with it: a request below that
        # looks exceeded whatever the task used)
        parts[-1] += "\n" + style.dim(
            "Level 1's peaks are the worker's private RSS, its own ~60-120 MiB included: "
            "requests below that always look exceeded. Trace at level 2 (memray) to judge "
            "requests by what each task allocated")
    if unfinished:  # (not failed, not done: a run that stopped, or a cut trace)
        said = ", ".join(f"{n} of '{fmt_name(name, style)}'" for name, n in unfinished)
        parts[-1] += f"\nUnfinished (in flight when the trace ended): {said}"
    if oom_killed:  # (failed or retried: say so, its memory figures are elsewhere)
        said = ", ".join(f"{n} of '{fmt_name(name, style)}'" for name, n in oom_killed)
        parts[-1] += (
            f"\nKilled by Ray's OOM killer (tasks, or an attempt Ray ran again): {said}; "
            f"`tracer memory {trace}` says where and the memory they used"
        )
        if largest_at_kill is not None:
            parts[-1] += (
                "\nThe Ray worker using the most memory at a kill, by Ray's report: "
                f"{fmt_name(str(largest_at_kill['command']), style)} (pid "
                f"{largest_at_kill['pid']}, {fmt_bytes(largest_at_kill['memory_bytes'], style)})"
            )
    if failures is not None and not failures.empty:
        parts.append(_failures(failures, style))
    if retries is not None and not retries.empty:
        parts.append(_retries(retries, style))
    loop_rows = records(loop)
    span = sum(r["total_ns"] or 0 for r in loop_rows)
    if actors is not None and not actors.empty:
        parts.append(_actor_starts(actors, span, style))
    if queues is not None and not queues.empty:
        parts.append(_stage_queues(queues, span, style))
    lat_rows = []
    for row in records(latency):
        out = {"stage_id": row["stage_id"], "stage": row["stage"], "tasks": row["tasks"]}
        for phase in ("waiting", "scheduling", "running", "pickup", "total"):
            p50 = fmt_dur(row[f"{phase}_p50_ns"], style)
            p95 = fmt_dur(row[f"{phase}_p95_ns"], style)
            out[phase] = f"{p50} / {p95}"
        lat_rows.append(out)
    parts.append(
        render_table(
            "Task latency by stage (p50 / p95): waiting in the runner, Ray scheduling, "
            "running, result pickup",
            [
                Column("id", "stage_id", fmt_count),
                name_column("stage", "stage"),
                Column("tasks", "tasks", fmt_count),
                Column("waiting", "waiting"),
                Column("scheduling", "scheduling"),
                Column("running", "running"),
                Column("pickup", "pickup"),
                Column("total", "total"),
            ],
            lat_rows,
            style,
            empty="(no tasks in this trace)",
        )
    )
    parts.extend(_ray_parts(latency, style))
    parts.append(
        render_table(
            f"Dispatch loop ({fmt_dur(span, style)}; batching excludes the plan polling in it)",
            [
                Column("phase", "phase", right=False),
                Column("count", "count", fmt_count),
                Column("total", "total_ns", fmt_dur),
                Column("mean", "mean_ns", fmt_dur),
                Column("share", "share", fmt_share),
            ],
            loop_rows,
            style,
        )
    )
    gc_line = _driver_gc(info, span, style)
    if gc_line:
        parts[-1] += "\n" + gc_line
    parts.append(_workers(util, style))
    return "\n\n".join(parts)


def _actor_starts(actors: pd.DataFrame, span: int, style: Style) -> str:
    """How long each stage's actors took to start (Ray Data's actor pools): a stage runs
    no task before its first actor is ready, and the loop's waves are empty meanwhile."""
    rows = []
    for row in records(actors):
        longest = row["start_max_ns"]
        rows.append({**row, "share": longest / span if span and longest is not None else None})
    return render_table(
        "Actors starting: from each actor's creation until it was ready (its __init__ "
        "done); the stage runs no task before its first one is ready",
        [
            Column("id", "stage_id", fmt_count),
            name_column("stage", "stage"),
            Column("actors", "actors", fmt_count),
            Column("ready", "ready", fmt_count),
            Column("start p50", "start_p50_ns", fmt_dur),
            Column("start max", "start_max_ns", fmt_dur),
            Column("max of run", "share", fmt_share),
        ],
        rows,
        style,
    )


def _stage_queues(queues: pd.DataFrame, span: int, style: Style) -> str:
    """Ray Data's own queues: a task's 'waiting' starts at its submission, and Ray Data
    submits once it lets the stage run; before, its blocks wait in these queues."""
    rows = []
    for row in records(queues):
        held = row["backpressured_ns"]
        rows.append({**row, "share": held / span if span and held is not None else None})
    return render_table(
        "Queues (the engine's, sampled at its scheduling steps): the most blocks queued "
        "at the stage's input at once, and the time it held the stage back (backpressure) "
        "with blocks queued; "
        "a block waits there before its task is created, outside the tasks' latency",
        [
            Column("id", "stage_id", fmt_count),
            name_column("stage", "stage"),
            Column("queued max", "queued_blocks_max", fmt_count),
            Column("held back", "backpressured_ns", fmt_dur),
            Column("of run", "share", fmt_share),
        ],
        rows,
        style,
    )


def _header(trace: str, engine: str, info: dict[str, Any], style: Style) -> str:
    bits = [f"Trace {trace}"]
    if info.get("execution_id"):
        bits.append(f"execution {info['execution_id']}")
    if info.get("runner"):
        bits.append(f"runner {info['runner']}")
    if info.get("tracing_level") is not None:
        bits.append(f"level {info['tracing_level']}")
    bits.append(f"engine {engine}")
    header = style.bold(bits[0]) + "  " + style.dim(", ".join(bits[1:]))
    if info.get("error_type"):
        said = _error_line(info["error_type"], info.get("error"))
        header += f"\nThe run ended with an error: {said[:250]}"
    mismatches = info.get(L.ARG_MEMORY_REQUEST_MISMATCHES)
    if mismatches:
        header += (f"\n{fmt_count(mismatches, style)} executions' memory requests are what "
                   "Ray reserved, not what their task said (kept as "
                   "memory_requested_by_runner)")
    lost = info.get(L.ARG_LOST_MEASUREMENTS)
    stopped = info.get(L.ARG_MEASUREMENTS_STOPPED)
    if lost or stopped:
        header += (f"\n{fmt_count(lost or 0, style)} tasks' measurements were lost (no "
                   "execution drawn for them: the 'task measurements lost' marks on the "
                   "dispatch loop say why)")
        if stopped:
            header += f"; the measurements stopped during the run: {str(stopped)[:200]}"
    per_task = info.get(L.ARG_MEMRAY_PER_TASK)
    if per_task:
        reason = " ".join(str(info.get(L.ARG_MEMRAY_PER_TASK_REASON) or "").split())
        header += (f"\n{fmt_count(per_task, style)} executions were measured with a memray "
                   "tracker each, ~20-90 ms more a task than one per worker"
                   + (f": {reason}" if reason else ""))
    source = info.get("ray_events_source")
    if source is None and info.get("ray_events_missing") is None:
        return header  # Ray's events were not read (level 0, TRACER_RAY_EVENTS=0)
    missing = info.get("ray_events_missing") or 0
    if source == "none":  # no read was made: nothing wanted them, or no read could be made
        line = "Ray's events not read: "
        line += (f"{fmt_count(missing, style)} executions without them" if missing
                 else "no execution needed them")
    else:
        line = f"Ray's events read from {source}: " if source else "Ray's events: "
        line += (f"{fmt_count(missing, style)} executions without them" if missing
                 else "none missing")
    dropped = info.get("ray_events_dropped") or 0
    # Only as a reason for what is missing: Ray's count includes events the tracer never
    # needs (the driver's own 'submit_task' events past Ray's 1000 a task: a run of
    # 10,000 tasks "dropped 9000" with nothing missing).
    if dropped and missing:
        line += f" ({fmt_count(dropped, style)} events dropped by Ray's caps)"
    return header + "\n" + (style.dim(line) if not missing else line)


#: The driver's GC time, as a share of the loop's, from which the summary says what to do.
GC_SHARE_HINT = 0.05


def _driver_gc(info: dict[str, Any], span: int, style: Style) -> str | None:
    """The driver's Python GC during the run: it holds the GIL, so the loop stood still."""
    count = info.get(L.ARG_DRIVER_GC_COLLECTIONS)
    total = info.get(L.ARG_DRIVER_GC_NS)
    if count is None or total is None:
        return None  # level 0, or a trace written before the driver's GC was recorded
    line = f"The driver's Python GC: {fmt_count(count, style)} collections, "
    line += f"{fmt_dur(total, style)} in all"
    if span:
        line += f" ({fmt_share(total / span, style)} of the loop's time)"
    longest = info.get(L.ARG_DRIVER_GC_LONGEST_NS)
    if longest:
        line += f", the longest {fmt_dur(longest, style)}"
    line += f"; those of {fmt_dur(MIN_PAUSE_NS, style)} or more are on the "
    line += f"'{L.DRIVER_GC_TRACK}' track"
    if span and total >= GC_SHARE_HINT * span:
        # What a user can do about it, where it matters.
        line += (" (a collection holds the GIL and the loop waits; gc.freeze() after "
                 "building long-lived objects keeps full collections from walking them)")
    return line if longest and longest >= MIN_PAUSE_NS else style.dim(line)


def _workers(util: pd.DataFrame, style: Style) -> str:
    rows = []
    buckets = 0
    bucket_ns = 0
    any_ray = False
    for (node, worker), group in util.groupby(["node", "worker"], sort=False, dropna=False):
        fractions = [float(f) for f in group["busy_fraction"]]
        buckets = len(fractions)
        bucket_ns = int(group["bucket_ns"].iloc[0])
        total = int(group["busy_ns"].sum())
        with_ray = int(group["busy_with_ray_ns"].sum())
        whole = bucket_ns * buckets
        rows.append(
            {
                "node": None if is_missing(node) else node,
                "worker": None if is_missing(worker) else worker,
                "busy": total / whole if whole else None,
                "with_ray": with_ray / whole if whole else None,
                "timeline": sparkline(fractions, style),
            }
        )
        any_ray = any_ray or with_ray > total
    title = "Workers: busy share of the run"
    columns = [
        name_column("node", "node"),
        name_column("worker", "worker"),
        Column("busy", "busy", fmt_share),
        Column("timeline", "timeline", right=False),
    ]
    if any_ray:
        # The executions time the tasks' bodies; Ray's handling in the worker around them
        # (arguments fetched, outputs stored) keeps the worker as busy: big returns can
        # fill a worker whose executions look short.
        title += " (with Ray: counting Ray's handling of each task, arguments and outputs)"
        columns.insert(3, Column("with Ray", "with_ray", fmt_share))
    if buckets:
        ramp = sparkline([i / 7 for i in range(8)], style)
        title += (f", and per {fmt_dur(bucket_ns, style)} bucket (timeline: "
                  f"'{ramp}' from idle to busy)")
    return render_table(
        title, columns, rows, style, empty="(no task executions in this trace)"
    )

"""The memory-budget assertions of :class:`~tracer.testing.run.TracedRun`, and their messages.

A failure is a :class:`~tracer.testing.errors.MemoryBudgetError` whose
message is what a developer acts on: what was exceeded, the worst tasks
(stage, task, node, worker, requested, peak, peak/request), the request
:mod:`tracer.query.suggest`'s rule would make, and where the traces are.
Input that cannot be checked (a bad budget, a stage that did not run, a
factor that is not a number) raises :class:`~tracer.testing.errors.TracedMemoryError`
or :class:`~tracer.sizes.InvalidSizeError`: never a pass.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracer.sizes import format_size, parse_size
from tracer.stats import nearest_rank
from tracer.testing.errors import MemoryBudgetError, TracedMemoryError

if TYPE_CHECKING:
    from tracer.testing.run import TaskMemory, TracedRun

__all__ = [
    "check_no_oom_kill",
    "check_stage_peak",
    "check_within_request",
    "parse_factor",
    "parse_stat",
    "stage_summary",
    "stage_values",
    "stat_of",
]

#: Tasks listed in a failure message, worst first.
WORST_SHOWN = 10

_STAT = re.compile(r"p(\d{1,3})", re.ASCII)


def parse_stat(stat: str) -> int:
    """``"max"`` -> 100, ``"p95"`` -> 95 (a percentile from 1 to 100)."""
    __tracebackhide__ = True
    if isinstance(stat, str):
        text = stat.strip().lower()
        if text == "max":
            return 100
        match = _STAT.fullmatch(text)
        if match and 1 <= int(match.group(1)) <= 100:
            return int(match.group(1))
    raise TracedMemoryError(
        f"stat must be 'max' or a percentile 'p1' to 'p100' (e.g. 'p95'), got {stat!r}"
    )


def parse_factor(factor: Any) -> float:
    """A positive, finite number (1.0: the request itself; 1.5: 50% above it)."""
    __tracebackhide__ = True
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise TracedMemoryError(f"factor must be a positive number, got {factor!r}")
    if not math.isfinite(factor) or factor <= 0:
        raise TracedMemoryError(f"factor must be a positive, finite number, got {factor!r}")
    return float(factor)


def stat_of(values: Sequence[int], percentile: int) -> int:
    """The nearest-rank percentile of ``values`` (100: the max), as tracer's analyses take it."""
    value = nearest_rank(values, percentile)
    if value is None:
        raise ValueError("no values to take a percentile of")
    return value


def stage_values(run: TracedRun, stage: str) -> list[int]:
    """The memory of each measured task of ``stage`` (a killed task's: at the kill)."""
    __tracebackhide__ = True
    tasks = run.stage_tasks(stage)
    values = [t.used for t in tasks if t.used is not None]
    if not values:
        raise TracedMemoryError(
            f"stage {stage!r} ran {len(tasks)} task(s), none measured: nothing to check"
        )
    return values


#: Where a task's memory request is set: the plugin sees tasks of any runner on tracer's API.
REQUEST_ARGUMENT = (
    "the request is Stage(memory_bytes=...) in tracer's runner, memory= in Ray's "
    ".options() / @ray.remote and in Ray Data's map_batches"
)


# ------------------------------------------------------------------ the checks


def check_within_request(run: TracedRun, factor: Any = 1.0, stages: Any = None) -> None:
    __tracebackhide__ = True  # pytest: the failure shows at the test's line
    limit = parse_factor(factor)
    names = _stage_names(run, stages)
    tasks = [t for name in names for t in run.stage_tasks(name) if t.measured]
    compared = [t for t in tasks if t.requested or t.oom_killed]
    if not compared:
        raise TracedMemoryError(
            f"no measured task of stage(s) {', '.join(repr(n) for n in names)} requested "
            f"memory ({REQUEST_ARGUMENT}): there is no request to compare a peak with; "
            "request memory, or set a budget with assert_stage_peak / stage_memory_limit"
        )
    over = [
        t for t in compared
        if t.oom_killed or (t.requested and t.used is not None and t.used > limit * t.requested)
    ]
    if not over:
        return
    bound = "their memory request" if limit == 1 else f"{limit:g}x their memory request"
    killed = sum(t.oom_killed for t in over)
    head = f"{len(over)} of {len(compared)} task(s) used more than {bound}"
    if killed:
        head += f" ({killed} killed by Ray's OOM killer)"
    over.sort(key=lambda t: (not t.oom_killed, -(t.ratio or 0.0), t.task_id))
    raise MemoryBudgetError(
        _message(head, over, run) + _suggestions(over) + _where(run, over)
    )


def check_stage_peak(run: TracedRun, stage: str, budget: Any, stat: str = "max") -> None:
    __tracebackhide__ = True  # pytest: the failure shows at the test's line
    limit = parse_size(budget, "budget")
    percentile = parse_stat(stat)
    values = stage_values(run, stage)
    tasks = [t for t in run.stage_tasks(stage) if t.measured]
    value = stat_of(values, percentile)
    killed = [t for t in tasks if t.oom_killed]
    if value <= limit and not killed:
        return
    label = "max" if percentile == 100 else f"p{percentile}"
    if value > limit:
        head = (
            f"stage {stage!r}: {label} peak {_bytes(value)} over its budget "
            f"{_bytes(limit)} ({len(tasks)} measured task(s))"
        )
    else:
        head = f"stage {stage!r}: {label} peak {_bytes(value)} within {_bytes(limit)}"
    if killed:
        head += f", and {len(killed)} task(s) killed by Ray's OOM killer"
    worst = [t for t in tasks if t.oom_killed or (t.used or 0) > limit]
    worst.sort(key=lambda t: (not t.oom_killed, -(t.used or 0), t.task_id))
    raise MemoryBudgetError(_message(head, worst, run) + _where(run, worst))


def check_no_oom_kill(run: TracedRun) -> None:
    __tracebackhide__ = True  # pytest: the failure shows at the test's line
    killed = [t for t in run.tasks if t.oom_killed]
    if killed:
        head = f"{len(killed)} task(s) killed by Ray's OOM killer"
        raise MemoryBudgetError(_message(head, killed, run) + _suggestions(killed) + _where(
            run, killed))


# ------------------------------------------------------------------ messages


def _stage_names(run: TracedRun, stages: Any) -> list[str]:
    __tracebackhide__ = True
    if stages is None:
        return list(run.stages)
    names = [stages] if isinstance(stages, str) else list(stages)
    if not names:
        raise TracedMemoryError("stages is empty: name at least one stage, or pass None for all")
    for name in names:
        run.stage_tasks(name)  # a clear error for a stage that did not run
    return names


def _columns() -> list[tuple[str, Callable[[TaskMemory], str]]]:
    def size(n: int | None) -> str:
        return "-" if n is None else format_size(n)

    return [
        ("stage", lambda t: t.stage),
        ("task", lambda t: t.task_id),
        ("attempt", lambda t: str(t.attempt)),
        ("node", lambda t: t.node or "-"),
        ("worker", lambda t: t.worker or "-"),
        ("requested", lambda t: size(t.requested)),
        ("peak", _peak_cell),
        ("peak/request", lambda t: "-" if t.ratio is None else f"{t.ratio:.2f}x"),
    ]


def _peak_cell(t: TaskMemory) -> str:
    if t.used is None:
        return "-"
    if t.oom_killed:
        return f"{format_size(t.used)} at kill"
    if t.peak_source in ("rss", "uss"):  # memray was unavailable: the worker's RSS or USS
        return f"{format_size(t.used)} ({t.peak_source.upper()})"
    return format_size(t.used)


def _bytes(n: int) -> str:
    """A size as the message shows it, with the exact bytes (16 MiB may be 16.002 MiB)."""
    return f"{format_size(n)} ({n:,} B)"


def _table(tasks: Sequence[TaskMemory]) -> list[str]:
    columns = _columns()
    cells = [[fmt(t) for _, fmt in columns] for t in tasks]
    headers = [h for h, _ in columns]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.extend(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )
    return ["  " + line for line in lines]


def _message(head: str, tasks: Sequence[TaskMemory], run: TracedRun) -> str:
    shown = list(tasks[:WORST_SHOWN])
    lines = [f"{head}; peaks are memray's heap peaks (tracing level 2)."]
    if shown:
        lines.append("The task:" if len(tasks) == 1 else "The worst tasks:")
        lines.extend(_table(shown))
        if len(tasks) > len(shown):
            lines.append(f"  ... and {len(tasks) - len(shown)} more")
    for warning in run.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def _suggestions(tasks: Sequence[TaskMemory]) -> str:
    from tracer.query.suggest import DEFAULT_HEADROOM, suggested_request

    peaks: dict[str, int] = {}
    for t in tasks:
        if t.used is not None:
            peaks[t.stage] = max(peaks.get(t.stage, 0), t.used)
    if not peaks:
        return ""
    parts = [
        f"{stage!r}: {suggested_request(peak)} bytes ({format_size(suggested_request(peak))})"
        for stage, peak in peaks.items()
    ]
    return (
        f"\nTo request (largest peak x {DEFAULT_HEADROOM}, rounded up to a MiB): "
        + "; ".join(parts)
        + f"\n  ({REQUEST_ARGUMENT})"
    )


def _where(run: TracedRun, tasks: Sequence[TaskMemory]) -> str:
    traces: list[Path] = []
    for t in tasks:
        if t.trace not in traces:
            traces.append(t.trace)
    if not traces:
        traces = run.traces
    listed = "\n".join(f"  {p}" for p in traces)
    return (
        f"\nTrace(s), kept after the test:\n{listed}\n"
        "(`tracer memory TRACE --suggest` for every stage; `tracer open TRACE` to look)"
    )


def stage_summary(run: TracedRun) -> str:
    rows = [("stage", "tasks", "measured", "requested", "peak p50", "peak max")]
    for name, tasks in run.stages.items():
        values = [t.used for t in tasks if t.used is not None]
        requests = [t.requested for t in tasks if t.requested]
        rows.append((
            name, str(len(tasks)), str(len(values)),
            format_size(max(requests)) if requests else "-",
            format_size(stat_of(values, 50)) if values else "-",
            format_size(max(values)) if values else "-",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )

"""Requested vs actual memory per stage, computed from a runner trace.

>>> print(memory_report("run.perfetto-trace"))  # doctest: +SKIP
memory per stage (actual = heap peak, memray)
stage     tasks  requested   actual min / median / max       over request
inflate       8    2.4 MiB   20.3 MiB / 20.3 MiB / 20.3 MiB  8 of 8
deflate       8   40.6 MiB    3.2 MiB /  3.2 MiB /  3.2 MiB  0 of 8

Everything comes from the trace's execution slices (their ``memory_requested``,
``memory_peak`` and ``over_request`` annotations, see
:mod:`tracer.ray.layout`), read with :func:`tracer.format.read_trace`, so it
works on any runner trace, not only while the run is alive.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Sequence

from tracer.format import TraceModel, read_trace
from tracer.ray import layout as L

__all__ = ["StageMemory", "format_bytes", "format_memory_table", "memory_by_stage", "memory_report"]


@dataclasses.dataclass(frozen=True)
class StageMemory:
    """One stage's memory: per-task requests and actual peaks (bytes), and how many went over."""

    stage: str
    tasks: int
    requested: tuple[int, int, int] | None  # (min, median, max); None: nothing measured
    peak: tuple[int, int, int] | None
    over_request: int
    without_request: int  # tasks that requested nothing (never "over")


def _summary(values: Sequence[int]) -> tuple[int, int, int] | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[0], int(statistics.median(ordered)), ordered[-1]


def memory_by_stage(model: TraceModel) -> list[StageMemory]:
    """Per stage (in stage-id order, then first seen), from the execution slices of ``model``."""
    order: dict[str, tuple[int, int]] = {}
    for s in model.slices:
        if s.category == L.CAT_STAGE and s.name is not None:
            order.setdefault(s.name, (int(s.args.get(L.ARG_STAGE_ID, 1 << 30)), len(order)))
    requested: dict[str, list[int]] = {}
    peaks: dict[str, list[int]] = {}
    counts: dict[str, int] = {}
    over: dict[str, int] = {}
    unrequested: dict[str, int] = {}
    for s in model.slices:
        if s.category != L.CAT_EXECUTION or s.name is None:
            continue
        name = s.name
        order.setdefault(name, (1 << 30, len(order)))
        counts[name] = counts.get(name, 0) + 1
        req = s.args.get(L.ARG_MEMORY_REQUESTED)
        if isinstance(req, int):
            requested.setdefault(name, []).append(req)
            if req == 0:
                unrequested[name] = unrequested.get(name, 0) + 1
        peak = s.args.get(L.ARG_MEMORY_PEAK)
        if isinstance(peak, int):
            peaks.setdefault(name, []).append(peak)
        if s.args.get(L.ARG_OVER_REQUEST) is True:
            over[name] = over.get(name, 0) + 1
    return [
        StageMemory(
            stage=name,
            tasks=counts.get(name, 0),
            requested=_summary(requested.get(name, [])),
            peak=_summary(peaks.get(name, [])),
            over_request=over.get(name, 0),
            without_request=unrequested.get(name, 0),
        )
        for name in sorted(order, key=order.__getitem__)
        if counts.get(name)
    ]


def format_bytes(n: int) -> str:
    """``n`` bytes in B, KiB, MiB or GiB, 3-4 significant digits."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _tracing_level(model: TraceModel) -> int | None:
    for s in model.slices:
        if s.category == L.CAT_SCHEDULER and s.name == L.SLICE_EXECUTION:
            level = s.args.get("tracing_level")
            return level if isinstance(level, int) else None
    return None


def format_memory_table(rows: Sequence[StageMemory], *, level: int | None = None) -> str:
    """A short text table of :func:`memory_by_stage` rows."""
    source = {2: "heap peak, memray", 1: "worker RSS peak"}.get(level or 0, "memory_peak")
    header = ("stage", "tasks", "requested", "actual min / median / max", "over request")
    lines = [header]
    for r in rows:
        if r.requested is None:
            req = "-"
        elif r.requested[0] == r.requested[2]:
            req = format_bytes(r.requested[0]) if r.requested[0] else "none"
        else:
            req = f"{format_bytes(r.requested[0])}..{format_bytes(r.requested[2])}"
        peak = " / ".join(format_bytes(v) for v in r.peak) if r.peak else "-"
        with_request = r.tasks - r.without_request
        over = f"{r.over_request} of {with_request}" if with_request else "no request"
        lines.append((r.stage, str(r.tasks), req, peak, over))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    right = {1, 2, 3}
    text = [f"memory per stage (actual = {source})"]
    for line in lines:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ]
        text.append("  ".join(cells).rstrip())
    return "\n".join(text)


def memory_report(trace: str | os.PathLike[str] | TraceModel) -> str:
    """The per-stage memory table of a runner trace (a path, or a model already read)."""
    model = trace if isinstance(trace, TraceModel) else read_trace(trace)
    return format_memory_table(memory_by_stage(model), level=_tracing_level(model))

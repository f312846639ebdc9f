"""scan_trace's output turned into a TraceModel, to compare with read_trace's (plain module)."""

from __future__ import annotations

import os
from typing import Any

from tracer.format import (
    CounterSample,
    Flow,
    Instant,
    ScannedInstant,
    ScannedSlice,
    Slice,
    TraceModel,
    TraceScan,
    TraceVisitor,
    scan_trace,
)

FIELDS = (
    "tracks", "slices", "instants", "counters", "flows", "problem_counts", "truncated",
    "packet_count", "trace_clock", "process_ordering", "thread_ordering",
)


class Collect(TraceVisitor):
    """Keeps everything it is handed, in the order it was handed over."""

    def __init__(self) -> None:
        self.slices: list[ScannedSlice] = []
        self.instants: list[ScannedInstant] = []
        self.counters: list[CounterSample] = []
        self.flows: list[Flow] = []

    def slice(self, s: ScannedSlice) -> None:
        self.slices.append(s)

    def instant(self, i: ScannedInstant) -> None:
        self.instants.append(i)

    def counter(self, c: CounterSample) -> None:
        self.counters.append(c)

    def flow(self, f: Flow) -> None:
        self.flows.append(f)


def as_model(visitor: Collect, scan: TraceScan) -> TraceModel:
    """What read_trace would have returned, from what a scan handed over.

    read_trace numbers slices and instants by (timestamp, file order): the
    scan's ids are file-order indexes, so sorting by (ts, id) gives the ranks.
    """
    events: list[ScannedSlice | ScannedInstant] = [*visitor.slices, *visitor.instants]
    order = sorted((e.ts, e.id) for e in events)
    rank = {ident: n for n, (_, ident) in enumerate(order)}
    assert len(rank) == len(order), "scan ids are not unique"

    def mapped(ident: int | None) -> int | None:
        return None if ident is None else rank[ident]

    names = {s.id: s.name for s in visitor.slices}
    for event in events:
        assert event.parent_name == (None if event.parent_id is None else names[event.parent_id])
    model = TraceModel(tracks=scan.tracks)
    model.slices = sorted(
        (Slice(rank[s.id], s.track_uuid, s.name, s.category, s.ts, s.dur, s.depth,
               mapped(s.parent_id), s.args, s.flow_ids_out, s.flow_ids_in)
         for s in visitor.slices),
        key=lambda s: s.id,
    )
    model.instants = sorted(
        (Instant(rank[i.id], i.track_uuid, i.name, i.category, i.ts, i.depth,
                 mapped(i.parent_id), i.args, i.flow_ids_out, i.flow_ids_in)
         for i in visitor.instants),
        key=lambda i: i.id,
    )
    model.counters = sorted(visitor.counters, key=lambda c: c.ts)  # stable: file order
    model.flows = [Flow(f.flow_id, rank[f.source_id], rank[f.dest_id]) for f in visitor.flows]
    model.problems = scan.problems
    model.problem_counts = scan.problem_counts
    model.truncated = scan.truncated
    model.packet_count = scan.packet_count
    model.trace_clock = scan.trace_clock
    model.process_ordering = scan.process_ordering
    model.thread_ordering = scan.thread_ordering
    counts = (scan.slice_count, scan.instant_count, scan.counter_count, scan.flow_count)
    assert counts == (len(visitor.slices), len(visitor.instants), len(visitor.counters),
                      len(visitor.flows))
    return model


def scanned_model(
    source: str | os.PathLike[str] | bytes, **options: Any
) -> TraceModel:
    visitor = Collect()
    scan = scan_trace(source, visitor, **options)
    return as_model(visitor, scan)


def assert_same_model(expected: TraceModel, got: TraceModel) -> None:
    """Equal in every field; the problems too, apart from the order they were found in."""
    for name in FIELDS:
        assert getattr(got, name) == getattr(expected, name), name
    if all(n < 100 for n in expected.problem_counts.values()):  # none left out: same lists
        assert sorted(map(str, got.problems)) == sorted(map(str, expected.problems))

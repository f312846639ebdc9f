"""Streaming a Perfetto protobuf trace: every slice, instant and counter handed over, none kept.

:func:`read_trace` builds a :class:`~tracer.format.model.TraceModel` with
every event of the trace, a few hundred bytes each: millions of events take
GBs. :func:`scan_trace` reads the same trace with the same rules (it shares
read_trace's framing and tokenizer, and its problems, counts and values are
read_trace's) but hands each slice, instant, counter and flow to a
:class:`TraceVisitor` as soon as it is complete, so that a caller keeps only
what it needs: its memory grows with what the visitor keeps.

What makes that possible: trace_processor (and read_trace) match a track's
BEGIN and END events in timestamp order, but writers append some events
late (tracer's writer ends a task's slice when the batch it was received in
is completed, after the next task on the same lane began). The scan holds
each track's events for ``window_ns`` of trace time behind the newest event
on that track and sorts them there, so an event may be written up to
``window_ns`` after a later one on its track. One written later than that
may come after events it should precede were matched: that stops the scan
with :class:`~tracer.errors.TraceOrderError` (the visitor has then seen part
of the trace; never a wrong answer): scan again with a larger window, or
``window_ns=None``, which holds every event until the end (exact for any
trace; memory grows with the trace again). Events are matched after each
compressed bundle and each 4 MiB of the file.
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_left, insort
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tracer.errors import TraceOrderError
from tracer.format._framing import Where
from tracer.format._tokenizer import _BEGIN, _END, Event, _Tokenizer
from tracer.format.model import CounterSample, Flow, Problem, TrackInfo
from tracer.format.reader import (
    DEFAULT_MAX_BUNDLE_SIZE,
    DEFAULT_MAX_INFLATED_SIZE,
    _closed_by_end,
    paused_gc,
    read_source,
)

__all__ = [
    "DEFAULT_WINDOW_NS",
    "ScannedInstant",
    "ScannedSlice",
    "TraceScan",
    "TraceVisitor",
    "scan_trace",
]

#: How far back (ns of trace time) an event may be written after a later event on
#: its track. tracer's writer ends a task's slices when the batch it was received
#: in is completed: measured up to ~0.1 s late (the batch's wait, at most 0.2 s,
#: plus the loop's work until its next check). The window's events are held in
#: memory: ~60 MB for 2 s of a fast runner's dispatch loop.
DEFAULT_WINDOW_NS = 2_000_000_000


class ScannedSlice(NamedTuple):
    """A slice as :func:`scan_trace` hands it over: :class:`~tracer.format.Slice`'s fields.

    ``id`` and ``parent_id`` are not read_trace's slice ids (those number the
    slices in timestamp order, which a scan cannot know before the end): they
    are the index of the slice's BEGIN event among the trace's events in
    file order. Sorting by ``(ts, id)`` gives read_trace's order.
    ``parent_name`` is the name of the slice it is nested in (a stream
    cannot look its parent up by id: the parent is handed over when it ends).
    """

    id: int
    track_uuid: int
    name: str | None
    category: str | None
    ts: int
    dur: int | None
    depth: int
    parent_id: int | None
    args: dict[str, Any]
    flow_ids_out: tuple[int, ...]
    flow_ids_in: tuple[int, ...]
    parent_name: str | None


class ScannedInstant(NamedTuple):
    """An instant as :func:`scan_trace` hands it over (``id``, ``parent_name``: see
    :class:`ScannedSlice`)."""

    id: int
    track_uuid: int
    name: str | None
    category: str | None
    ts: int
    depth: int
    parent_id: int | None
    args: dict[str, Any]
    flow_ids_out: tuple[int, ...]
    flow_ids_in: tuple[int, ...]
    parent_name: str | None


class TraceVisitor:
    """What :func:`scan_trace` hands the trace to; override the methods you need.

    * :meth:`slice`: every slice, once it ended; the slices of one track come
      in the order they end in timestamp order (nested ones before the slice
      they are nested in); slices that never end come at the end of the scan,
      with ``dur=None``. No order across tracks.
    * :meth:`instant`: every instant, in timestamp order on its track.
    * :meth:`counter`: every counter sample, in file order (values as
      read_trace gives them). Not overriding it saves the scan their cost.
    * :meth:`flow`: every flow, at the end, in read_trace's order, between
      ``ScannedSlice.id`` / ``ScannedInstant.id``.

    Track descriptors are in :attr:`TraceScan.tracks` at the end (a track
    may be described after its events).
    """

    def slice(self, s: ScannedSlice) -> None:
        """A slice (ended, or never ended at the end of the scan)."""

    def instant(self, i: ScannedInstant) -> None:
        """An instant."""

    def counter(self, c: CounterSample) -> None:
        """A counter sample."""

    def flow(self, f: Flow) -> None:
        """A flow between two slices or instants."""


@dataclass
class TraceScan:
    """What :func:`scan_trace` found apart from the events themselves.

    The fields mean what :class:`~tracer.format.TraceModel`'s do, and hold
    the same values; ``problems`` lists the first problems of each kind in
    the order the scan found them (read_trace finds the slice and flow
    problems in timestamp order), ``problem_counts`` counts them all.
    ``slice_count`` ... ``flow_count`` count what the visitor was handed.
    """

    tracks: dict[int, TrackInfo] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    problem_counts: dict[str, int] = field(default_factory=dict)
    truncated: bool = False
    packet_count: int = 0
    trace_clock: int = 6
    process_ordering: str | None = None
    thread_ordering: str | None = None
    slice_count: int = 0
    instant_count: int = 0
    counter_count: int = 0
    flow_count: int = 0


def scan_trace(
    path_or_bytes: str | os.PathLike[str] | bytes | bytearray | memoryview,
    visitor: TraceVisitor,
    *,
    window_ns: int | None = DEFAULT_WINDOW_NS,
    strict: bool = False,
    max_bundle_size: int = DEFAULT_MAX_BUNDLE_SIZE,
    max_inflated_size: int = DEFAULT_MAX_INFLATED_SIZE,
) -> TraceScan:
    """Read a Perfetto protobuf trace (a path, or its bytes) and hand its events to ``visitor``.

    The events, values and problems are :func:`~tracer.format.read_trace`'s
    (see :class:`TraceVisitor` for their order); ``strict``,
    ``max_bundle_size`` and ``max_inflated_size`` mean what they mean there,
    and the same inputs raise :class:`~tracer.errors.TraceReadError`. A file
    is read 4 MiB at a time.

    ``window_ns`` bounds how late (in trace time) an event may be written
    after a later event on its track; one later than that may raise
    :class:`~tracer.errors.TraceOrderError` (the module's docstring says
    why). ``None``: no bound, every event is held until the end.

    The cyclic garbage collector is paused during the scan (as during
    read_trace): the scan makes millions of small acyclic objects.
    """
    if max_bundle_size < 1:
        raise ValueError(f"max_bundle_size must be positive, got {max_bundle_size}")
    if max_inflated_size < 1:
        raise ValueError(f"max_inflated_size must be positive, got {max_inflated_size}")
    if window_ns is not None and (isinstance(window_ns, bool) or window_ns < 0):
        raise ValueError(f"window_ns must be >= 0 or None, got {window_ns!r}")
    with paused_gc():
        scanner = read_source(
            path_or_bytes,
            lambda what: _Scanner(
                what, strict, max_bundle_size, max_inflated_size, visitor, window_ns
            ),
        )
    return scanner.result


class _Queue:
    """One track's events not yet matched (sorted by timestamp, then file order),
    and its open slices."""

    __slots__ = ("done_ts", "max_ts", "pending", "reported", "stack", "uuid")

    def __init__(self, uuid: int) -> None:
        self.uuid = uuid
        # Events (see _tokenizer.Event) sorted by (ts, index): time, then file order.
        self.pending: list[Event] = []
        self.max_ts = -(1 << 64)  # the newest event's timestamp
        self.done_ts = -(1 << 64)  # the last matched event's timestamp
        # Open slices: [id, ts, name, category, depth, parent, args, flows out, flows in,
        # where, parent's name]
        self.stack: list[list[Any]] = []
        self.reported = False  # its events are dropped (counter track), and said once


class _Scanner(_Tokenizer):
    """The tokenizer's events, matched per track within a window, handed to a visitor."""

    def __init__(
        self,
        what: str,
        strict: bool,
        max_bundle_size: int,
        max_inflated: int,
        visitor: TraceVisitor,
        window_ns: int | None,
    ) -> None:
        super().__init__(what, strict, max_bundle_size, max_inflated)
        self.visitor = visitor
        self.window = window_ns
        self.result = TraceScan(tracks=self.tracks)
        self.queues: dict[int, _Queue] = {}
        self.flows = _FlowLog()
        self.on_slice = visitor.slice
        self.on_instant = visitor.instant
        self.wants_counters = type(visitor).counter is not TraceVisitor.counter

    # ------------------------------------------------------------- stream

    def drain(self) -> None:
        """Queue the events tokenized since the last call on their tracks, and match
        those that are older than the window behind their track's newest event."""
        counters = self.counters
        if counters:
            self.result.counter_count += len(counters)
            if self.wants_counters:
                on_counter = self.visitor.counter
                for ts, uuid, value in counters:
                    on_counter(CounterSample(uuid, ts, value))
            self.counters = []
        events = self.events
        if not events:
            return
        self.events = []
        queues = self.queues
        touched: dict[int, _Queue] = {}
        for event in events:
            ts = event[0]
            uuid = event[3]
            queue = queues.get(uuid)
            if queue is None:
                queue = queues[uuid] = _Queue(uuid)
            if ts >= queue.max_ts:
                queue.pending.append(event)
                queue.max_ts = ts
            elif ts >= queue.done_ts:
                insort(queue.pending, event)  # (ts, index) are unique: the rest is not compared
            else:
                self.too_late(queue, event)
            touched[uuid] = queue
        window = self.window
        if window is None:
            return
        tracks = self.tracks
        for uuid, queue in touched.items():
            if uuid not in tracks:
                continue  # held until its descriptor comes, or to the end
            pending = queue.pending
            cut = bisect_left(pending, (queue.max_ts - window,))
            if cut:
                self.match(queue, pending[:cut])
                del pending[:cut]

    def too_late(self, queue: _Queue, event: Event) -> None:
        track = self.tracks.get(queue.uuid)
        name = track.name if track is not None else None
        raise TraceOrderError(
            f"{self.what}: an event on track {queue.uuid} ({name!r}) at ts {event[0]} was "
            f"written after one at ts {queue.max_ts} on the same track, more than "
            f"window_ns={self.window} later in trace time; scan with a larger window_ns, "
            "or window_ns=None",
            track_uuid=queue.uuid,
            lateness_ns=queue.max_ts - event[0],
        )

    def match(self, queue: _Queue, items: list[Event]) -> None:
        """BEGIN/END matching of one track's events, in timestamp order (read_trace's rules)."""
        uuid = queue.uuid
        track = self.tracks[uuid]
        queue.done_ts = items[-1][0]
        if track.kind == "counter":
            if not queue.reported:
                queue.reported = True
                self.problem(
                    "slice_on_counter_track",
                    f"slice events on counter track {uuid} ({track.name!r}) are dropped",
                    items[0][9],
                )
            return
        stack = queue.stack
        log_flows = self.flows.add
        on_slice = self.on_slice
        on_instant = self.on_instant
        result = self.result
        for ts, index, kind, _, name, category, args, out, into, where in items:
            if kind == _BEGIN:
                slice_id = index
                stack.append(
                    [
                        index,
                        ts,
                        name,
                        category,
                        len(stack),
                        stack[-1][0] if stack else None,
                        args if args is not None else {},
                        out,
                        into,
                        where,
                        stack[-1][2] if stack else None,
                    ]
                )
            elif kind == _END:
                at = _closed_by_end(self.problem, stack, uuid, track.name, name, category, where)
                if at is None:
                    continue
                entry = stack.pop(at)
                slice_id = entry[0]
                if args:
                    entry[6].update(args)
                if out:
                    entry[7] += out
                if into:
                    entry[8] += into
                result.slice_count += 1
                on_slice(_scanned(entry, uuid, ts - entry[1]))
            else:
                slice_id = index
                result.instant_count += 1
                on_instant(
                    ScannedInstant(
                        index,
                        uuid,
                        name,
                        category,
                        ts,
                        len(stack),
                        stack[-1][0] if stack else None,
                        args if args is not None else {},
                        out,
                        into,
                        stack[-1][2] if stack else None,
                    )
                )
            if out or into:
                log_flows(ts, index, slice_id, out, into, where)

    # ------------------------------------------------------------- the end

    def finish(self) -> None:
        self.drain()
        self.finish_tokenizing()
        tracks = self.tracks
        for uuid, queue in self.queues.items():
            pending, queue.pending = queue.pending, []
            if not pending:
                continue
            if uuid in tracks:
                self.match(queue, pending)
            else:
                self.problem(
                    "undeclared_track",
                    f"events on track {uuid}, which has no descriptor, are dropped",
                    pending[0][9],
                )
        for uuid, queue in self.queues.items():
            for entry in queue.stack:
                self.result.slice_count += 1
                self.on_slice(_scanned(entry, uuid, None))
                self.problem(
                    "unterminated_slice",
                    f"slice {entry[2]!r} on track {uuid} ({tracks[uuid].name!r}) never ends "
                    "(trace_processor shows it as 'Did not end')",
                    entry[9],
                )
            queue.stack = []
        self.finish_flows()
        self.report_to(self.result)

    def finish_flows(self) -> None:
        """Flows join events in timestamp order across tracks: matched at the end."""
        log, self.flows = self.flows, _FlowLog()
        active: dict[int, int] = {}
        on_flow = self.visitor.flow
        result = self.result
        for flow_id, slice_id, terminates, where in log.in_order():
            if not terminates:
                previous = active.get(flow_id)
                if previous is not None:
                    result.flow_count += 1
                    on_flow(Flow(flow_id, previous, slice_id))
                active[flow_id] = slice_id
                continue
            previous = active.pop(flow_id, None)
            if previous is None:
                self.problem(
                    "flow_end_without_start",
                    f"terminating flow id {flow_id} was never started; no arrow is drawn",
                    where,
                )
            else:
                result.flow_count += 1
                on_flow(Flow(flow_id, previous, slice_id))


class _FlowLog:
    """The flow ids of the events matched so far, in arrays: ~60 bytes per id.

    Flows are matched in timestamp order across all tracks, and a writer may
    write a flow's start long after its end (tracer writes a stage's slice,
    and its arrows to every execution, when the stage ends): so they wait
    for the end of the scan, as compactly as they can.
    """

    def __init__(self) -> None:
        self.ts = array("q")
        self.index = array("q")
        self.slice_id = array("q")
        self.flow_id = array("Q")
        self.terminates = array("b")
        self.packet = array("q")
        self.offset = array("q")
        self.inner = array("q")  # -1: not in a bundle

    def add(
        self,
        ts: int,
        index: int,
        slice_id: int,
        out: tuple[int, ...],
        into: tuple[int, ...],
        where: Where,
    ) -> None:
        packet, offset, inner = where
        for terminates, ids in ((0, out), (1, into)):
            for flow_id in ids:
                self.ts.append(ts)
                self.index.append(index)
                self.slice_id.append(slice_id)
                self.flow_id.append(flow_id)
                self.terminates.append(terminates)
                self.packet.append(packet)
                self.offset.append(offset)
                self.inner.append(-1 if inner is None else inner)

    def in_order(self) -> Iterator[tuple[int, int, bool, Where]]:
        """(flow id, slice id, terminates, where), events in timestamp then file order,
        an event's ids in its order (the ones it starts first)."""
        # Two stable sorts with plain int keys (no tuple per id): by file order, then time.
        order = sorted(range(len(self.ts)), key=self.index.__getitem__)
        order.sort(key=self.ts.__getitem__)
        for i in order:
            inner = self.inner[i]
            yield (
                self.flow_id[i],
                self.slice_id[i],
                bool(self.terminates[i]),
                (self.packet[i], self.offset[i], None if inner < 0 else inner),
            )


def _scanned(entry: list[Any], uuid: int, dur: int | None) -> ScannedSlice:
    """The ScannedSlice of an open-slice entry of _Scanner.match (dur None: it never ended)."""
    return ScannedSlice(
        entry[0], uuid, entry[2], entry[3], entry[1], dur, entry[4], entry[5], entry[6],
        entry[7], entry[8], entry[10],
    )

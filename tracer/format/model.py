"""A plain, read-only model of a Perfetto trace, as :func:`tracer.format.read_trace` returns it.

It holds what trace_processor would show for the parts of the format that
tracer writes: tracks, slices, instants, counters and flows, plus the
:class:`Problem` list of everything trace_processor would drop or get wrong.

Conventions (they follow trace_processor's proto importer):

* Timestamps are nanoseconds in the trace clock (BOOTTIME unless a snapshot
  names another ``primary_trace_clock``); for traces written by
  :class:`~tracer.format.TraceWriter` that is the writer's ``clock`` domain.
* Slice ids follow the order of the slices' begin timestamps (ties keep file
  order); instants take ids from the same sequence, as they are zero-length
  slices in trace_processor's ``slice`` table. Flows refer to these ids.
* Counter values are multiplied by the descriptor's ``unit_multiplier``, as
  trace_processor does. An ``int`` sample stays an ``int`` (exact); a double
  sample is a ``float``. (trace_processor stores every value as a double.)
* Debug annotations become Python values: ``bool``, ``int``, ``float``, ``str``,
  ``dict`` and ``list``. An annotation that has no value at all (what the
  writer makes of an empty dict or list) reads back as ``None``. Names are
  returned as written; trace_processor shows ``debug.<name>`` and replaces
  ``.``, ``[`` and ``]`` in names by ``_``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "CounterSample",
    "Flow",
    "Instant",
    "MAX_PROBLEMS_PER_KIND",
    "Problem",
    "ProblemKind",
    "Slice",
    "TraceModel",
    "TrackInfo",
    "TrackKind",
]

#: ``TraceModel.problems`` keeps at most this many problems of one kind.
MAX_PROBLEMS_PER_KIND = 100

TrackKind = Literal["process", "thread", "track", "counter"]

#: What can be wrong in a trace (see :class:`Problem`).
ProblemKind = Literal[
    # Framing and encoding.
    "bad_framing",  # bytes where a ``Trace.packet`` record should start; reading stops there
    "bad_packet",  # a complete record that does not decode as a TracePacket; skipped
    "bad_bundle",  # a compressed_packets bundle that does not inflate or holds broken records
    # Sequences and interning.
    "missing_sequence_id",  # TrackEvent / interned data / defaults without a sequence id
    "not_cleared",  # interned data or ids used while the sequence's incremental state is invalid
    "unknown_iid",  # an iid with no definition in the current generation of the sequence
    "iid_redefined",  # an iid defined again with different content (the first one wins)
    # Timestamps.
    "bad_timestamp",  # a timestamp that cannot be converted to trace time; event dropped
    # Tracks.
    "bad_descriptor",  # a TrackDescriptor trace_processor rejects (no uuid; thread without pid/tid)
    "undeclared_track",  # an event (or a parent) names a track uuid with no descriptor
    "track_redefined",  # a uuid described twice with different content (the first one wins)
    # Counters.
    "counter_before_descriptor",  # a counter event before its counter descriptor; dropped
    "counter_on_non_counter_track",  # a counter event on a slice track; dropped
    "counter_missing_value",  # a counter event without a value; dropped
    "extra_counter_mismatch",  # extra counter values without as many track uuids, or over 8
    "slice_on_counter_track",  # a begin / end / instant on a counter track; dropped
    # Slices and flows.
    "unmatched_end",  # an END with no open slice on its track; ignored
    "misplaced_end",  # an END that closes a slice below the top of its track's stack
    "unterminated_slice",  # a slice still open at the end of the trace (dur is None)
    "flow_end_without_start",  # a terminating flow id that no earlier event started
    "unsupported_event",  # a TrackEvent type tracer does not read (e.g. TYPE_UNSPECIFIED)
]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing trace_processor would drop, misread or flag.

    ``packet_index`` counts decoded TracePackets from 0 in file order (packets
    inside compressed bundles included; the bundle record itself is not
    counted); ``offset`` is the byte offset in the file of the record (for a
    packet inside a bundle, of the bundle record) and ``inner_offset`` the
    packet's offset inside the inflated bundle.
    """

    kind: ProblemKind
    message: str
    packet_index: int | None = None
    offset: int | None = None
    inner_offset: int | None = None

    def __str__(self) -> str:
        where = []
        if self.packet_index is not None:
            where.append(f"packet {self.packet_index}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        if self.inner_offset is not None:
            where.append(f"bundle offset {self.inner_offset}")
        suffix = f" ({', '.join(where)})" if where else ""
        return f"{self.kind}: {self.message}{suffix}"


@dataclass(frozen=True, slots=True)
class TrackInfo:
    """A TrackDescriptor.

    ``kind`` is ``"thread"`` for a thread descriptor, ``"process"`` for a
    process descriptor, ``"counter"`` for a counter descriptor and ``"track"``
    otherwise. ``name`` is the thread or process name for those kinds (the
    descriptor's own name is what trace_processor ignores on thread tracks).
    ``unit`` (counters only) is ``"count"``, ``"bytes"``, ``"ns"`` or the
    ``unit_name``. ``child_ordering`` is ``"lexicographic"``,
    ``"chronological"`` or ``"explicit"``; ``sibling_merge_behavior`` is
    ``"by_track_name"``, ``"none"`` or ``"by_sibling_merge_key"`` (``None``:
    unspecified, which trace_processor treats as by name).
    """

    uuid: int
    name: str | None
    kind: TrackKind
    parent_uuid: int | None = None
    pid: int | None = None
    tid: int | None = None
    unit: str | None = None
    unit_multiplier: int = 1
    is_incremental: bool = False
    sibling_order_rank: int | None = None
    child_ordering: str | None = None
    sibling_merge_behavior: str | None = None
    description: str | None = None
    y_axis_share_key: str | None = None


@dataclass(frozen=True, slots=True)
class Slice:
    """A slice: a BEGIN matched with its END on the same track (a stack per track).

    ``dur`` is ``None`` for a slice left open at the end of the trace.
    ``category`` joins several categories with commas, as trace_processor
    does. ``args`` holds the BEGIN's debug annotations with the END's merged
    in (the END's win on a clash). ``flow_ids_out`` / ``flow_ids_in`` are the
    ``flow_ids`` / ``terminating_flow_ids`` written on the slice's events.
    """

    id: int
    track_uuid: int
    name: str | None
    category: str | None
    ts: int
    dur: int | None
    depth: int
    parent_id: int | None
    args: dict[str, Any] = field(default_factory=dict)
    flow_ids_out: tuple[int, ...] = ()
    flow_ids_in: tuple[int, ...] = ()

    @property
    def end_ts(self) -> int | None:
        return None if self.dur is None else self.ts + self.dur


@dataclass(frozen=True, slots=True)
class Instant:
    """An instant event; trace_processor stores it as a zero-length slice nested
    under the slice open on its track (``depth`` / ``parent_id``)."""

    id: int
    track_uuid: int
    name: str | None
    category: str | None
    ts: int
    depth: int
    parent_id: int | None
    args: dict[str, Any] = field(default_factory=dict)
    flow_ids_out: tuple[int, ...] = ()
    flow_ids_in: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CounterSample:
    """One counter value, already multiplied by the track's ``unit_multiplier``."""

    track_uuid: int
    ts: int
    value: int | float


@dataclass(frozen=True, slots=True)
class Flow:
    """An arrow between two slices (or instants), as a row of trace_processor's ``flow`` table.

    The source is the earlier event: flow ids are matched in timestamp order.
    A flow id that is continued (a non-terminating repeat) makes one row per step.
    """

    flow_id: int
    source_id: int
    dest_id: int


@dataclass(slots=True)
class TraceModel:
    """Everything :func:`tracer.format.read_trace` decoded.

    ``slices``, ``instants`` and ``counters`` are sorted by timestamp (ties in
    file order). ``truncated`` is true when the file ends inside a packet (a
    trace cut while being written); that packet is ignored, as trace_processor
    ignores it. ``process_ordering`` / ``thread_ordering`` are ``"explicit"``
    when the root descriptor (uuid 0) asks for rank ordering. ``trace_clock``
    is the clock id timestamps are expressed in (6, BOOTTIME, by default).

    ``problems`` keeps the first :data:`MAX_PROBLEMS_PER_KIND` problems of
    each kind; ``problem_counts`` counts them all.
    """

    tracks: dict[int, TrackInfo] = field(default_factory=dict)
    slices: list[Slice] = field(default_factory=list)
    instants: list[Instant] = field(default_factory=list)
    counters: list[CounterSample] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    truncated: bool = False
    packet_count: int = 0
    problem_counts: dict[str, int] = field(default_factory=dict)
    trace_clock: int = 6
    process_ordering: str | None = None
    thread_ordering: str | None = None
    _children: dict[int, list[int]] | None = field(default=None, repr=False, compare=False)
    _pids: dict[int, TrackInfo] | None = field(default=None, repr=False, compare=False)
    _by_id: dict[int, Slice | Instant] | None = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------ track tree

    def parent_of(self, uuid: int) -> TrackInfo | None:
        """The track shown as ``uuid``'s parent.

        That is the descriptor's ``parent_uuid``; a thread track (which has
        none) belongs to the process track with its pid, as in the UI.
        """
        track = self.tracks[uuid]
        if track.kind == "thread" and track.pid is not None:
            return self._process_by_pid().get(track.pid)
        if track.parent_uuid is None:
            return None
        return self.tracks.get(track.parent_uuid)

    def track_path(self, uuid: int) -> list[str | None]:
        """Names from the top-level track down to ``uuid`` (``KeyError`` if unknown)."""
        path: list[str | None] = []
        seen: set[int] = set()
        current: TrackInfo | None = self.tracks[uuid]
        while current is not None and current.uuid not in seen:
            seen.add(current.uuid)
            path.append(current.name)
            current = self.parent_of(current.uuid)
        path.reverse()
        return path

    def children(self, uuid: int | None = None) -> list[TrackInfo]:
        """The tracks whose parent (see :meth:`parent_of`) is ``uuid``; ``None``: top-level tracks.

        Listed in declaration order.
        """
        if self._children is None:
            index: dict[int, list[int]] = {}
            for track in self.tracks.values():
                parent = self.parent_of(track.uuid)
                index.setdefault(-1 if parent is None else parent.uuid, []).append(track.uuid)
            self._children = index
        return [self.tracks[u] for u in self._children.get(-1 if uuid is None else uuid, [])]

    def walk(self) -> Iterator[tuple[int, TrackInfo]]:
        """Every track, depth-first from the top level, with its depth in the tree."""
        stack = [(0, t) for t in reversed(self.children(None))]
        seen: set[int] = set()
        while stack:
            depth, track = stack.pop()
            if track.uuid in seen:
                continue
            seen.add(track.uuid)
            yield depth, track
            stack.extend((depth + 1, t) for t in reversed(self.children(track.uuid)))

    def _process_by_pid(self) -> dict[int, TrackInfo]:
        if self._pids is None:
            self._pids = {
                t.pid: t for t in self.tracks.values() if t.kind == "process" and t.pid is not None
            }
        return self._pids

    # --------------------------------------------------------------- lookups

    def slices_on(self, uuid: int) -> list[Slice]:
        """The slices of one track, by timestamp."""
        return [s for s in self.slices if s.track_uuid == uuid]

    def counters_on(self, uuid: int) -> list[CounterSample]:
        """The samples of one counter track, by timestamp."""
        return [c for c in self.counters if c.track_uuid == uuid]

    def slice_by_id(self, slice_id: int) -> Slice | Instant:
        """The slice or instant with this id (``KeyError`` if none)."""
        if self._by_id is None:
            index: dict[int, Slice | Instant] = {s.id: s for s in self.slices}
            index.update((i.id, i) for i in self.instants)
            self._by_id = index
        return self._by_id[slice_id]

"""Tokenizing a Perfetto protobuf trace: packets decoded into events, in file order.

The second stage of both readers (:func:`tracer.format.read_trace` and
:func:`tracer.format.scan_trace`), following trace_processor's proto
tokenizer and track event importer for the part of the format tracer writes:
per-sequence incremental state (interning, packet defaults,
SEQ_INCREMENTAL_STATE_CLEARED), clock snapshots and timestamp conversion
(delta timestamps on sequence-scoped incremental clocks such as 64, absolute
ones on BOOTTIME or any clock a snapshot relates to the trace clock), track
descriptors, and counter events (which, as in trace_processor, need their
counter descriptor *earlier* in the file).

Each record is decoded with our generated ``TracePacket`` class (protobuf's
parser bounds nesting; its errors become ``bad_packet`` problems). The
output is :attr:`_Tokenizer.events` (slice and instant events, file order),
:attr:`_Tokenizer.counters` and :attr:`_Tokenizer.tracks`; what a reader
does with them (sort them all, or stream them) is the subclass's business.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

from google.protobuf.message import DecodeError

from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.errors import TraceReadError
from tracer.format._framing import Where, _Framer
from tracer.format._wire import (
    CHILD_ORDERING,
    CLOCK_BOOTTIME,
    COUNTER_UNITS,
    INT64_MAX,
    INT64_MIN,
    TYPE_BEGIN,
    TYPE_COUNTER,
    TYPE_END,
    TYPE_INSTANT,
)
from tracer.format.model import TrackInfo, TrackKind

__all__ = ["Event"]

_SEQ_INCREMENTAL_STATE_CLEARED = 1
_SEQ_NEEDS_INCREMENTAL_STATE = 2

_BOOTTIME = CLOCK_BOOTTIME
_INT64_MIN = INT64_MIN
_INT64_MAX = INT64_MAX

_BEGIN = TYPE_BEGIN
_END = TYPE_END
_INSTANT = TYPE_INSTANT
_COUNTER = TYPE_COUNTER

#: trace_processor's kMaxNumExtraCounters.
_MAX_EXTRA_COUNTERS = 8

_COUNTER_UNITS = {value: name for name, value in COUNTER_UNITS.items()}
_CHILD_ORDERING = {value: name for name, value in CHILD_ORDERING.items()}
_MERGE_BEHAVIOR = {1: "by_track_name", 2: "none", 3: "by_sibling_merge_key"}

_parse_packet = pb.TracePacket.FromString

try:  # the replays' hot path in C, built at install when a compiler is there
    from tracer.format import _readspeedups
except ImportError:  # pragma: no cover - the pure Python path is tested with TRACER_PURE_PYTHON
    _readspeedups = None  # type: ignore[assignment]


def use_read_speedups() -> bool:
    """Whether new readers take the C fast path: built, and not turned off by
    ``TRACER_PURE_PYTHON`` (the writer's switch, see tracer.format.writer)."""
    return _readspeedups is not None and os.environ.get("TRACER_PURE_PYTHON", "") in ("", "0")

class _Sequence:
    """Incremental state of one packet sequence (trusted_packet_sequence_id)."""

    __slots__ = (
        "anchor",
        "anchor_epoch",
        "ann_names",
        "categories",
        "clock_default",
        "counter_totals",
        "extra_default",
        "extra_double_default",
        "generation",
        "names",
        "running",
        "snapshot",
        "strings",
        "track_default",
        "valid",
    )

    def __init__(self) -> None:
        # trace_processor starts every sequence with its incremental state
        # invalid: interned data is ignored until SEQ_INCREMENTAL_STATE_CLEARED.
        self.valid = False
        # Bumped whenever what a packet decodes to may change (clear, defaults,
        # packet loss): cached decodings of an older generation are not reused.
        self.generation = 0
        self.names: dict[int, str] = {}
        self.categories: dict[int, str] = {}
        self.ann_names: dict[int, str] = {}
        self.strings: dict[int, str] = {}
        self.clock_default = 0
        self.track_default: int | None = None
        self.extra_default: list[int] = []
        self.extra_double_default: list[int] = []
        self.counter_totals: dict[int, int | float] = {}
        # The last ClockSnapshot on this sequence: clock id -> (ns, unit
        # multiplier, incremental); and the running value (ns) of its
        # incremental clocks. A clear does not reset clocks; a snapshot does.
        self.snapshot: dict[int, tuple[int, int, bool]] = {}
        self.running: dict[int, int] = {}
        # The snapshot's trace time (Tokenizer.convert), valid while anchor_epoch is the
        # number of global snapshots so far.
        self.anchor: int | None = None
        self.anchor_epoch = -1

    def clear(self) -> None:
        self.valid = True
        self.generation += 1
        self.names = {}
        self.categories = {}
        self.ann_names = {}
        self.strings = {}
        self.clock_default = 0
        self.track_default = None
        self.extra_default = []
        self.extra_double_default = []
        self.counter_totals = {}


class _Template:
    """What a simple, problem-free packet decoded to, apart from its timestamp.

    The writer repeats byte-identical packets (same track, name, category and
    often the same args; only the timestamp differs), so the reader caches
    their decoding (args included, when their values are flat) by the bytes
    around the timestamp field (the packet's last field, or its first in
    traces from earlier versions). It is reused only on the same sequence
    generation: interned tables only grow (a redefinition is ignored), so a
    lookup that succeeded once gives the same answer until the next clear.
    """

    __slots__ = (
        "args",
        "category",
        "clock",
        "generation",
        "kind",
        "name",
        "seq",
        "seq_id",
        "uuid",
        "value",
    )

    def __init__(
        self,
        seq: _Sequence,
        seq_id: int,
        clock: int,
        kind: int,
        uuid: int,
        name: str | None,
        category: str | None,
        value: int | float,
        args: dict[str, Any] | None,
    ) -> None:
        self.seq = seq
        self.seq_id = seq_id
        self.generation = seq.generation
        self.clock = clock
        self.kind = kind
        self.uuid = uuid
        self.name = name
        self.category = category
        self.value = value
        self.args = args


#: At most this many cached packet decodings (see _Template).
_TEMPLATE_LIMIT = 4096
#: At most this many packets seen once and not cached yet (see _Tokenizer.record).
_SEEN_LIMIT = 4 * _TEMPLATE_LIMIT
#: The TracePacket fields a cacheable packet may have.
_SIMPLE_PACKET_FIELDS = frozenset(
    {"timestamp", "timestamp_clock_id", "trusted_packet_sequence_id", "track_event"}
)
#: The TrackEvent fields a cacheable event may have.
_SIMPLE_EVENT_FIELDS = frozenset(
    {
        "type",
        "track_uuid",
        "name",
        "name_iid",
        "categories",
        "category_iids",
        "counter_value",
        "double_counter_value",
        "debug_annotations",
    }
)
#: Annotation values a cached decoding may hold (see _Tokenizer.remember).
_FLAT = frozenset({bool, int, float, str, type(None)})


class _Skip(Exception):
    """Drops the packet being tokenized (its problem is already recorded)."""


# A tokenized event, sorted by its first two items (time, then file order):
# (ts, index, type, track uuid, name, category, args, flow ids, terminating flow ids, where)
# where index counts the events from 0 in file order.
Event = tuple[
    int,
    int,
    int,
    int,
    str | None,
    str | None,
    dict[str, Any] | None,
    tuple[int, ...],
    tuple[int, ...],
    Where,
]


class _Tokenizer(_Framer):
    """Decodes records into :attr:`events`, :attr:`counters` and :attr:`tracks`."""

    def __init__(self, what: str, strict: bool, max_bundle_size: int, max_inflated: int) -> None:
        super().__init__(what, strict, max_bundle_size, max_inflated)
        self.tracks: dict[int, TrackInfo] = {}
        self.sequences: dict[int, _Sequence] = {}
        self.events: list[Event] = []
        self.event_count = 0  # events tokenized so far (the next one's index)
        # Counter samples as (ts, track uuid, value): a reader makes CounterSamples of
        # them only if it keeps them.
        self.counters: list[tuple[int, int, int | float]] = []
        self.early_counters: list[tuple[int, Where]] = []
        self.trace_clock = _BOOTTIME
        self.converted_any = False
        self.global_snapshots: list[dict[int, tuple[int, int]]] = []
        self.track_where: dict[int, Where] = {}
        self.seen: set[bytes] = set()  # see record
        self.process_ordering: str | None = None
        self.thread_ordering: str | None = None
        if use_read_speedups():
            self.fast_forward = _readspeedups.replay_run

    def finish(self) -> None:
        """Called once the whole input is read (the reader's last step)."""
        raise NotImplementedError

    # ------------------------------------------------------------- records

    def record(self, record: bytes, first: bool, key: bytes | None, raw: int) -> None:
        """Decode and tokenize one record; ``key`` and ``raw`` are its bytes apart
        from a leading or trailing timestamp field and that timestamp (key None
        if it has neither)."""
        try:
            packet = _parse_packet(record)
        except DecodeError as exc:
            if first:
                raise TraceReadError(
                    f"{self.what}: not a Perfetto protobuf trace (its first record does not "
                    f"decode as a TracePacket: {exc})"
                ) from None
            self.packet_index += 1
            self.problem("bad_packet", f"a record that does not decode as a TracePacket: {exc}")
            return
        if first and record and not packet.ListFields():
            raise TraceReadError(
                f"{self.what}: not a Perfetto protobuf trace (its first record holds no "
                "TracePacket field)"
            )
        if packet.HasField("compressed_packets"):
            _, offset, inner = self.where
            if inner is not None:
                raise TraceReadError(
                    f"{self.what}: a compressed bundle inside a compressed bundle (file offset "
                    f"{offset}, bundle offset {inner}); trace_processor cannot read that"
                )
            self.bundle(packet.compressed_packets, offset)
            return
        self.packet_index += 1
        problems = self.problem_total
        events = len(self.events)
        counters = len(self.counters)
        try:
            self.tokenize(packet)
        except _Skip:
            return
        if key is not None and self.problem_total == problems:
            # Remembered when seen a second time: most packets that are not replays of
            # templates never repeat (unique args or counter values).
            seen = self.seen
            if key in seen:
                self.remember(packet, key, raw, events, counters)
            elif len(seen) < _SEEN_LIMIT:
                seen.add(key)
            else:
                seen.clear()

    def remember(
        self, packet: pb.TracePacket, key: bytes, raw: int, events: int, counters: int
    ) -> None:
        """Cache what ``packet`` decoded to, if it is simple enough (see _Template)."""
        if packet.timestamp != raw or packet.WhichOneof("data") != "track_event":
            return
        event = packet.track_event
        if any(f.name not in _SIMPLE_EVENT_FIELDS for f, _ in event.ListFields()):
            return
        if any(f.name not in _SIMPLE_PACKET_FIELDS for f, _ in packet.ListFields()):
            return
        if _parse_packet(key).HasField("timestamp"):
            return  # a second timestamp field (the last one wins) would not be replayed
        seq_id = packet.trusted_packet_sequence_id
        seq = self.sequences[seq_id]
        clock = packet.timestamp_clock_id or seq.clock_default
        if len(self.events) == events + 1:
            _, _, kind, uuid, name, category, args, _, _, _ = self.events[-1]
            if args is not None and any(v.__class__ not in _FLAT for v in args.values()):
                return  # nested values would be shared by every replay
            template = _Template(
                seq, seq_id, clock, kind, uuid, name, category, 0,
                None if args is None else args.copy(),  # the event's own may be changed
            )
        elif len(self.counters) == counters + 1:
            _, sample_uuid, value = self.counters[-1]
            if self.tracks[sample_uuid].is_incremental:
                return
            template = _Template(seq, seq_id, clock, _COUNTER, sample_uuid, None, None, value, None)
        else:
            return
        templates = self.templates
        if len(templates) >= _TEMPLATE_LIMIT:
            # Packets that never repeat (unique args or counter values) fill the
            # cache; starting afresh lets the repeating ones back in.
            templates.clear()
        templates[key] = template

    def replay(self, template: _Template, raw: int) -> None:
        """Tokenize a packet from its cached decoding and its timestamp."""
        seq = template.seq
        clock = template.clock
        # convert()'s path for a sequence-scoped clock whose snapshot's place in trace
        # time is known (most packets of a trace), inline.
        entry = seq.snapshot.get(clock) if 64 <= clock < 128 else None
        if (
            entry is not None
            and seq.anchor_epoch == len(self.global_snapshots)
            and seq.anchor is not None
            and clock != self.trace_clock
        ):
            base_ns, multiplier, incremental = entry
            if incremental:
                value = seq.running[clock] + raw * multiplier
                seq.running[clock] = value
            else:
                value = raw * multiplier
            ts = seq.anchor + value - base_ns
            if not _INT64_MIN <= ts <= _INT64_MAX:
                self.problem(
                    "bad_timestamp", f"timestamp {ts} does not fit in int64; the packet is dropped"
                )
                return
        else:
            try:
                ts = self.convert(raw, clock, template.seq_id, seq)
            except _Skip:
                return
        if template.kind == _COUNTER:
            self.counters.append((ts, template.uuid, template.value))
        else:
            args = template.args
            index = self.event_count
            self.event_count = index + 1
            self.events.append(
                (
                    ts,
                    index,
                    template.kind,
                    template.uuid,
                    template.name,
                    template.category,
                    None if args is None else args.copy(),  # each event owns its args
                    (),
                    (),
                    self.where,
                )
            )

    def sequence_of(self, seq_id: int) -> _Sequence:
        seq = self.sequences.get(seq_id)
        if seq is None:
            seq = self.sequences[seq_id] = _Sequence()
        return seq

    def tokenize(self, packet: pb.TracePacket) -> None:
        has = packet.HasField
        seq_id = packet.trusted_packet_sequence_id
        seq = self.sequence_of(seq_id) if seq_id else None
        flags = packet.sequence_flags
        # Order as in trace_processor: clear, then defaults, interned data,
        # the clock snapshot, and only then the packet's own timestamp.
        if seq is not None:
            if flags & _SEQ_INCREMENTAL_STATE_CLEARED or packet.incremental_state_cleared:
                seq.clear()
            elif packet.previous_packet_dropped:
                seq.valid = False
                seq.generation += 1
        if has("trace_packet_defaults"):
            if seq is None:
                self.problem(
                    "missing_sequence_id",
                    "trace_packet_defaults without a trusted_packet_sequence_id",
                )
            else:
                defaults = packet.trace_packet_defaults
                seq.generation += 1
                seq.clock_default = defaults.timestamp_clock_id
                event_defaults = defaults.track_event_defaults
                seq.track_default = (
                    event_defaults.track_uuid
                    if defaults.HasField("track_event_defaults")
                    and event_defaults.HasField("track_uuid")
                    else None
                )
                seq.extra_default = list(event_defaults.extra_counter_track_uuids)
                seq.extra_double_default = list(event_defaults.extra_double_counter_track_uuids)
        if has("interned_data"):
            if seq is None:
                self.problem(
                    "missing_sequence_id", "interned_data without a trusted_packet_sequence_id"
                )
            elif not seq.valid:
                self.problem(
                    "not_cleared",
                    f"interned_data on sequence {seq_id} before SEQ_INCREMENTAL_STATE_CLEARED "
                    "(or after a packet loss); trace_processor ignores it",
                )
            else:
                self.intern(seq, packet.interned_data)
        which = packet.WhichOneof("data")
        if which == "clock_snapshot":
            self.clock_snapshot(packet.clock_snapshot, seq_id, seq)
            return
        if flags & _SEQ_NEEDS_INCREMENTAL_STATE and (seq is None or not seq.valid):
            self.problem(
                "not_cleared",
                "a packet flagged SEQ_NEEDS_INCREMENTAL_STATE while the sequence's incremental "
                "state is invalid; trace_processor drops it",
            )
            return
        if which == "track_event":
            if seq is None:
                self.problem(
                    "missing_sequence_id",
                    "a TrackEvent without a trusted_packet_sequence_id; dropped",
                )
                return
            if not has("timestamp"):
                self.problem("bad_timestamp", "a TrackEvent without a timestamp; dropped")
                return
            ts = self.timestamp(packet, seq_id, seq)
            self.track_event(packet.track_event, ts, seq)
            return
        if has("timestamp"):
            self.timestamp(packet, seq_id, seq)
        if which == "track_descriptor":
            self.track_descriptor(packet.track_descriptor)

    def intern(self, seq: _Sequence, interned: pb.InternedData) -> None:
        for name in interned.event_names:
            self.define(seq.names, name.iid, _text(name.name), "event name")
        for category in interned.event_categories:
            self.define(seq.categories, category.iid, _text(category.name), "category")
        for ann in interned.debug_annotation_names:
            self.define(seq.ann_names, ann.iid, _text(ann.name), "annotation name")
        for value in interned.debug_annotation_string_values:
            self.define(seq.strings, value.iid, _text(value.str), "annotation string value")

    def define(self, table: dict[int, str], iid: int, value: str, what: str) -> None:
        old = table.get(iid)
        if old is None:
            table[iid] = value
        elif old != value:
            self.problem(
                "iid_redefined",
                f"{what} iid {iid} redefined as {value!r} (it was {old!r}); the first one wins",
            )

    def lookup(self, table: dict[int, str], iid: int, seq: _Sequence, what: str) -> str | None:
        value = table.get(iid)
        if value is None:
            if seq.valid:
                self.problem("unknown_iid", f"{what} iid {iid} is not defined on its sequence")
            else:
                self.problem(
                    "not_cleared",
                    f"{what} iid {iid} used before the sequence's incremental state was cleared",
                )
        return value

    # ---------------------------------------------------------------- clocks

    def clock_snapshot(
        self, snapshot: pb.ClockSnapshot, seq_id: int, seq: _Sequence | None
    ) -> None:
        clocks: dict[int, tuple[int, int, bool]] = {}
        global_clocks: dict[int, tuple[int, int]] = {}
        for clock in snapshot.clocks:
            clock_id = clock.clock_id
            multiplier = clock.unit_multiplier_ns or 1
            ns = clock.timestamp * multiplier
            if 64 <= clock_id < 128:
                if seq is None:
                    self.problem(
                        "bad_timestamp",
                        f"a ClockSnapshot with sequence-scoped clock {clock_id} but no sequence "
                        "id (a fatal error in trace_processor)",
                    )
                    continue
                clocks[clock_id] = (ns, multiplier, clock.is_incremental)
            else:
                clocks[clock_id] = (ns, multiplier, False)
                global_clocks[clock_id] = (ns, multiplier)
        if not self.converted_any:
            if snapshot.primary_trace_clock:
                self.trace_clock = int(snapshot.primary_trace_clock)
            elif _BOOTTIME in global_clocks and 11 not in global_clocks:
                self.trace_clock = _BOOTTIME
        if global_clocks:
            self.global_snapshots.append(global_clocks)
        if seq is not None and seq_id:
            seq.snapshot = clocks
            seq.running = {cid: ns for cid, (ns, _, incr) in clocks.items() if incr}
            seq.anchor_epoch = -1

    def timestamp(self, packet: pb.TracePacket, seq_id: int, seq: _Sequence | None) -> int:
        """The packet's timestamp in trace time (advancing incremental clocks); or _Skip."""
        clock = packet.timestamp_clock_id
        if not clock and seq is not None:
            clock = seq.clock_default
        return self.convert(packet.timestamp, clock, seq_id, seq)

    def convert(self, raw: int, clock: int, seq_id: int, seq: _Sequence | None) -> int:
        """``raw`` on ``clock`` (0: none) in trace time; raises _Skip if it cannot be."""
        self.converted_any = True
        if not clock or clock == self.trace_clock:
            ts = raw
        elif 64 <= clock < 128:
            if seq is None:
                self.fail_timestamp(f"sequence-scoped clock {clock} without a sequence id")
            entry = seq.snapshot.get(clock)
            if entry is None:
                self.fail_timestamp(f"clock {clock} has no ClockSnapshot on sequence {seq_id}")
            base_ns, multiplier, incremental = entry
            if incremental:
                value = seq.running[clock] + raw * multiplier
                seq.running[clock] = value
            else:
                value = raw * multiplier
            # Where the sequence's snapshot is in trace time: cached until the sequence
            # gets a new snapshot or the trace a new global one (it may relate the clocks).
            if seq.anchor_epoch == len(self.global_snapshots):
                anchor = seq.anchor
            else:
                anchor = seq.anchor = self.snapshot_trace_time(seq.snapshot)
                seq.anchor_epoch = len(self.global_snapshots)
            if anchor is None:
                self.fail_timestamp(
                    f"the ClockSnapshot of clock {clock} has no path to the trace clock "
                    f"{self.trace_clock}"
                )
            ts = anchor + value - base_ns
        else:
            converted = self.global_to_trace(clock, raw)
            if converted is None:
                self.fail_timestamp(
                    f"no ClockSnapshot relates clock {clock} to the trace clock {self.trace_clock}"
                )
            ts = converted
        if not _INT64_MIN <= ts <= _INT64_MAX:
            self.fail_timestamp(f"timestamp {ts} does not fit in int64")
        return ts

    def fail_timestamp(self, message: str) -> NoReturn:
        self.problem("bad_timestamp", f"{message}; the packet is dropped")
        raise _Skip

    def snapshot_trace_time(self, snapshot: dict[int, tuple[int, int, bool]]) -> int | None:
        entry = snapshot.get(self.trace_clock)
        if entry is not None:
            return entry[0]
        for clock_id, (ns, multiplier, _) in snapshot.items():
            if not 64 <= clock_id < 128:
                converted = self.global_to_trace(clock_id, ns // multiplier)
                if converted is not None:
                    return converted
        return None

    def global_to_trace(self, clock: int, raw: int) -> int | None:
        target = self.trace_clock
        for snapshot in reversed(self.global_snapshots):
            entry = snapshot.get(clock)
            anchor = snapshot.get(target)
            if entry is not None and anchor is not None:
                return anchor[0] + raw * entry[1] - entry[0]
        return None

    # ---------------------------------------------------------------- tracks

    def track_descriptor(self, desc: pb.TrackDescriptor) -> None:
        has = desc.HasField
        if not has("uuid"):
            self.problem("bad_descriptor", "a TrackDescriptor without a uuid; ignored")
            return
        uuid = desc.uuid
        if uuid == 0:
            # The root descriptor: only its ordering fields matter.
            if desc.process_ordering:
                self.process_ordering = _ordering(desc.process_ordering)
            if desc.thread_ordering:
                self.thread_ordering = _ordering(desc.thread_ordering)
            return
        name = (
            _text(desc.name)
            if has("name")
            else (_text(desc.static_name) if has("static_name") else None)
        )
        kind: TrackKind = "track"
        pid = tid = None
        unit = None
        unit_multiplier = 1
        is_incremental = False
        y_axis = None
        if has("thread"):
            thread = desc.thread
            if not (thread.HasField("pid") and thread.HasField("tid")):
                self.problem(
                    "bad_descriptor", f"thread track {uuid} without both pid and tid; ignored"
                )
                return
            kind, pid, tid = "thread", thread.pid, thread.tid
            if thread.HasField("thread_name"):
                name = _text(thread.thread_name)
        elif has("process"):
            process = desc.process
            if not process.HasField("pid"):
                self.problem("bad_descriptor", f"process track {uuid} without a pid; ignored")
                return
            kind, pid = "process", process.pid
            if process.HasField("process_name"):
                name = _text(process.process_name)
        elif has("counter"):
            counter = desc.counter
            kind = "counter"
            if counter.type == 1:
                unit = "ns"
            elif counter.type == 2:
                unit = "count"
            elif counter.unit in _COUNTER_UNITS:
                unit = _COUNTER_UNITS[counter.unit]
            elif counter.HasField("unit_name"):
                unit = _text(counter.unit_name)
            if counter.unit_multiplier > 0:
                unit_multiplier = counter.unit_multiplier
            is_incremental = counter.is_incremental
            y_axis = (
                _text(counter.y_axis_share_key) if counter.HasField("y_axis_share_key") else None
            )
        info = TrackInfo(
            uuid=uuid,
            name=name,
            kind=kind,
            parent_uuid=desc.parent_uuid if has("parent_uuid") else None,
            pid=pid,
            tid=tid,
            unit=unit,
            unit_multiplier=unit_multiplier,
            is_incremental=is_incremental,
            sibling_order_rank=desc.sibling_order_rank if has("sibling_order_rank") else None,
            child_ordering=_CHILD_ORDERING.get(desc.child_ordering),
            sibling_merge_behavior=_MERGE_BEHAVIOR.get(desc.sibling_merge_behavior),
            description=_text(desc.description) if has("description") else None,
            y_axis_share_key=y_axis,
        )
        old = self.tracks.get(uuid)
        if old is None:
            self.tracks[uuid] = info
            self.track_where[uuid] = self.where
        elif old != info:
            self.problem(
                "track_redefined",
                f"track {uuid} described again differently ({old.name!r} -> {info.name!r}); "
                "the first description is kept",
            )

    # ---------------------------------------------------------------- events

    def track_event(self, event: pb.TrackEvent, ts: int, seq: _Sequence) -> None:
        kind = event.type
        if event.HasField("track_uuid"):
            uuid = event.track_uuid
        elif seq.track_default is not None:
            uuid = seq.track_default
        else:
            self.problem(
                "undeclared_track", "a TrackEvent with no track_uuid and no default track; dropped"
            )
            return
        if kind not in (_BEGIN, _END, _INSTANT, _COUNTER):
            self.problem("unsupported_event", f"a TrackEvent of type {kind}; ignored")
            return
        if kind == _COUNTER or event.extra_counter_values or event.extra_double_counter_values:
            samples = self.counter_samples(event, kind, uuid, seq)
            if samples is None:
                return
            counters = self.counters
            for sample_uuid, value in samples:
                counters.append((ts, sample_uuid, value))
            if kind == _COUNTER:
                return
        name: str | None = None
        iid = event.name_iid
        if iid:
            name = self.lookup(seq.names, iid, seq, "event name")
        elif event.HasField("name"):
            name = _text(event.name)
        category: str | None = None
        if event.category_iids or event.categories:
            parts = [
                c
                for c in (
                    self.lookup(seq.categories, i, seq, "category") for i in event.category_iids
                )
                if c is not None
            ]
            parts.extend(_text(c) for c in event.categories)
            category = ",".join(parts) if parts else None
        args = None
        if event.debug_annotations:
            args = {}
            for ann in event.debug_annotations:
                key = self.annotation_name(ann, seq)
                if key is not None:
                    args[key] = self.annotation_value(ann, seq)
        flows: tuple[int, ...] = tuple(event.flow_ids or event.flow_ids_old)
        terminating: tuple[int, ...] = tuple(
            event.terminating_flow_ids or event.terminating_flow_ids_old
        )
        index = self.event_count
        self.event_count = index + 1
        self.events.append(
            (ts, index, kind, uuid, name, category, args, flows, terminating, self.where)
        )

    def counter_samples(
        self, event: pb.TrackEvent, kind: int, uuid: int, seq: _Sequence
    ) -> list[tuple[int, int | float]] | None:
        """The counter values an event carries (its own, for a COUNTER, and its
        extra counters), as (track uuid, value); None if trace_processor drops
        the whole event."""
        samples: list[tuple[int, int | float]] = []
        if kind == _COUNTER:
            which = event.WhichOneof("counter_value_field")
            raw: int | float
            if which == "counter_value":
                raw = event.counter_value
            elif which == "double_counter_value":
                raw = event.double_counter_value
            else:
                self.problem(
                    "counter_missing_value",
                    f"a counter event without a value on track {uuid}; dropped",
                )
                return None
            value = self.counter_value(uuid, raw, seq, "a counter event")
            if value is None:
                return None
            samples.append((uuid, value))
        ints = event.extra_counter_values
        doubles = event.extra_double_counter_values
        if not ints and not doubles:
            return samples
        index = 0
        for values, own, default in (
            (ints, event.extra_counter_track_uuids, seq.extra_default),
            (doubles, event.extra_double_counter_track_uuids, seq.extra_double_default),
        ):
            if not values:
                continue
            uuids = list(own) if own else default
            if len(values) > len(uuids):
                self.problem(
                    "extra_counter_mismatch",
                    f"{len(values)} extra counter values but {len(uuids)} extra counter track "
                    "uuids (in the event or its sequence's defaults); the event is dropped",
                )
                return None
            if index + len(values) > _MAX_EXTRA_COUNTERS:
                self.problem(
                    "extra_counter_mismatch",
                    f"more than {_MAX_EXTRA_COUNTERS} extra counter values; the event is dropped",
                )
                return None
            index += len(values)
            for extra_uuid, raw_extra in zip(uuids, values, strict=False):  # extra uuids unused
                value = self.counter_value(extra_uuid, raw_extra, seq, "an extra counter value")
                if value is None:
                    return None
                samples.append((extra_uuid, value))
        return samples

    def counter_value(
        self, uuid: int, raw: int | float, seq: _Sequence, what: str
    ) -> int | float | None:
        """``raw`` as trace_processor stores it (unit_multiplier, incremental
        counters); None (and a problem) if ``uuid`` is not a counter track yet."""
        track = self.tracks.get(uuid)
        if track is None:
            # Resolved at the end: a descriptor later in the file does not help.
            self.early_counters.append((uuid, self.where))
            return None
        if track.kind != "counter":
            self.problem(
                "counter_on_non_counter_track",
                f"{what} on {track.kind} track {uuid} ({track.name!r}); the event is dropped",
            )
            return None
        value = raw * track.unit_multiplier if track.unit_multiplier != 1 else raw
        if track.is_incremental:
            value = seq.counter_totals.get(uuid, 0) + value
            seq.counter_totals[uuid] = value
        return value

    def annotation_name(self, ann: pb.DebugAnnotation, seq: _Sequence) -> str | None:
        iid = ann.name_iid
        if iid:
            return self.lookup(seq.ann_names, iid, seq, "annotation name")
        return _text(ann.name)

    def annotation_value(self, ann: pb.DebugAnnotation, seq: _Sequence) -> Any:
        which = ann.WhichOneof("value")
        if which is None:
            if ann.dict_entries:
                out: dict[str, Any] = {}
                for entry in ann.dict_entries:
                    key = self.annotation_name(entry, seq)
                    if key is not None:
                        out[key] = self.annotation_value(entry, seq)
                return out
            if ann.array_values:
                return [self.annotation_value(item, seq) for item in ann.array_values]
            return None
        if which == "string_value":
            return _text(ann.string_value)
        if which == "int_value":
            return ann.int_value
        if which == "bool_value":
            return ann.bool_value
        if which == "double_value":
            return ann.double_value
        if which == "uint_value":
            return ann.uint_value
        if which == "string_value_iid":
            return self.lookup(seq.strings, ann.string_value_iid, seq, "annotation string value")
        if which == "pointer_value":
            return ann.pointer_value
        return _text(ann.legacy_json_value)

    def finish_tokenizing(self) -> None:
        for uuid, where in self.early_counters:
            if uuid in self.tracks:
                self.problem(
                    "counter_before_descriptor",
                    f"a counter event on track {uuid} before its descriptor; trace_processor "
                    "drops it (counter descriptors must come first in the file)",
                    where,
                )
            else:
                self.problem(
                    "undeclared_track",
                    f"a counter event on track {uuid}, which has no descriptor",
                    where,
                )
        for track in self.tracks.values():
            parent = track.parent_uuid
            if parent and parent not in self.tracks:
                self.problem(
                    "undeclared_track",
                    f"track {track.uuid} ({track.name!r}) has parent {parent}, which has no "
                    "descriptor",
                    self.track_where.get(track.uuid),
                )


def _ordering(value: int) -> str:
    return "explicit" if value == 1 else f"unknown({value})"


def _text(value: str | bytes) -> str:
    """A protobuf string as ``str``: upb hands back ``bytes`` for invalid UTF-8."""
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return value.decode("utf-8", "replace")


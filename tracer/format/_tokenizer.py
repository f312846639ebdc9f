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

The rooms, each a layer of the class chain that ends in :class:`_Tokenizer`:
framing (:mod:`._framing`, records and compressed bundles), clocks
(:mod:`._clocks`), a TrackEvent's fields (:mod:`._event_fields`), track
descriptors (:mod:`._descriptors`), cached decodings (:mod:`._templates`),
per-sequence state (:mod:`._sequence`); this module routes each packet.

Each record is decoded with our generated ``TracePacket`` class (protobuf's
parser bounds nesting; its errors become ``bad_packet`` problems). The
output is :attr:`_Tokenizer.events` (slice and instant events, file order),
:attr:`_Tokenizer.counters` and :attr:`_Tokenizer.tracks`; what a reader
does with them (sort them all, or stream them) is the subclass's business.
"""

from __future__ import annotations

from typing import Protocol

from google.protobuf.message import DecodeError

from tracer._env import env_flag
from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.errors import TraceReadError
from tracer.format._descriptors import ordering, track_info
from tracer.format._event_fields import _BEGIN, _COUNTER, _END, Event, _EventReader
from tracer.format._framing import Where
from tracer.format._sequence import _Sequence, _Skip
from tracer.format._templates import (
    _FLAT,
    _SEEN_LIMIT,
    _SIMPLE_EVENT_FIELDS,
    _SIMPLE_PACKET_FIELDS,
    _TEMPLATE_LIMIT,
    _Template,
)
from tracer.format._wire import INT64_MAX, INT64_MIN
from tracer.format.model import Problem

__all__ = ["_BEGIN", "_END", "Event"]  # the readers sort begins before ends

_SEQ_INCREMENTAL_STATE_CLEARED = 1
_SEQ_NEEDS_INCREMENTAL_STATE = 2

_INT64_MIN = INT64_MIN
_INT64_MAX = INT64_MAX

_parse_packet = pb.TracePacket.FromString

try:  # the replays' hot path in C, built at install when a compiler is there
    from tracer.format import _readspeedups
except ImportError:  # pragma: no cover - the pure Python path is tested with TRACER_PURE_PYTHON
    _readspeedups = None  # type: ignore[assignment]


def use_read_speedups() -> bool:
    """Whether new readers take the C fast path: built, and not turned off by
    ``TRACER_PURE_PYTHON`` (the writer's switch, see tracer.format.writer)."""
    return _readspeedups is not None and not env_flag("TRACER_PURE_PYTHON", False)


class _FileFacts(Protocol):
    """The file-wide facts both readers' results carry (TraceModel, TraceScan)."""

    problems: list[Problem]
    problem_counts: dict[str, int]
    truncated: bool
    packet_count: int
    trace_clock: int
    process_ordering: str | None
    thread_ordering: str | None


class _Tokenizer(_EventReader):
    """Decodes records into :attr:`events`, :attr:`counters` and :attr:`tracks`."""

    def __init__(self, what: str, strict: bool, max_bundle_size: int, max_inflated: int) -> None:
        super().__init__(what, strict, max_bundle_size, max_inflated)
        self.sequences: dict[int, _Sequence] = {}
        self.track_where: dict[int, Where] = {}
        self.seen: set[bytes] = set()  # see record
        self.process_ordering: str | None = None
        self.thread_ordering: str | None = None
        if use_read_speedups():
            self.fast_forward = _readspeedups.replay_run

    def finish(self) -> None:
        """Called once the whole input is read (the reader's last step)."""
        raise NotImplementedError

    def report_to(self, result: _FileFacts) -> None:
        """What every read says of the file, whatever it builds (a model, a scan)."""
        result.problems = self.problems
        result.problem_counts = self.problem_counts
        result.truncated = self.truncated
        result.packet_count = self.packet_index
        result.trace_clock = self.trace_clock
        result.process_ordering = self.process_ordering
        result.thread_ordering = self.thread_ordering

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

    # ---------------------------------------------------------------- tracks

    def track_descriptor(self, desc: pb.TrackDescriptor) -> None:
        if not desc.HasField("uuid"):
            self.problem("bad_descriptor", "a TrackDescriptor without a uuid; ignored")
            return
        uuid = desc.uuid
        if uuid == 0:
            # The root descriptor: only its ordering fields matter.
            if desc.process_ordering:
                self.process_ordering = ordering(desc.process_ordering)
            if desc.thread_ordering:
                self.thread_ordering = ordering(desc.thread_ordering)
            return
        info = track_info(desc, uuid)
        if isinstance(info, str):
            self.problem("bad_descriptor", info)
            return
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

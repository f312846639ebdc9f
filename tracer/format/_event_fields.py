"""A TrackEvent's fields decoded as trace_processor's track event importer reads them.

Names, categories and annotation keys and values come inline or interned
per sequence (an iid looked up in the sequence's tables, valid only after
SEQ_INCREMENTAL_STATE_CLEARED); counter values come scaled by their track's
``unit_multiplier`` and summed when the track is incremental, and only for a
counter track already described *earlier* in the file. Slices and instants
become :data:`Event` tuples in file order; counter samples
``(ts, track uuid, value)``.
"""

from __future__ import annotations

from typing import Any

from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.format._clocks import _ClockReader
from tracer.format._framing import Where
from tracer.format._sequence import _Sequence, _text
from tracer.format._wire import TYPE_BEGIN, TYPE_COUNTER, TYPE_END, TYPE_INSTANT
from tracer.format.model import TrackInfo

__all__ = ["Event"]

_BEGIN = TYPE_BEGIN
_END = TYPE_END
_INSTANT = TYPE_INSTANT
_COUNTER = TYPE_COUNTER

#: trace_processor's kMaxNumExtraCounters.
_MAX_EXTRA_COUNTERS = 8

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



class _EventReader(_ClockReader):
    """The clock reader plus interning and TrackEvent decoding."""

    def __init__(self, what: str, strict: bool, max_bundle_size: int, max_inflated: int) -> None:
        super().__init__(what, strict, max_bundle_size, max_inflated)
        self.tracks: dict[int, TrackInfo] = {}
        self.events: list[Event] = []
        self.event_count = 0  # events tokenized so far (the next one's index)
        # Counter samples as (ts, track uuid, value): a reader makes CounterSamples of
        # them only if it keeps them.
        self.counters: list[tuple[int, int, int | float]] = []
        # Counter events on tracks not described yet (a problem, found at the end).
        self.early_counters: list[tuple[int, Where]] = []

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

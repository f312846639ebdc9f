"""read_trace on hand-made traces: every problem kind, strict mode, not-a-trace input,
and the trace_processor import rules the reader follows.

Traces are built packet by packet with our generated classes; timestamps are
raw (no clock snapshot) unless a test is about clocks.
"""

from __future__ import annotations

import gzip
import random
import typing
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trace_helpers import trace_bytes

from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.errors import TraceReadError, TracerError
from tracer.format import ProblemKind, read_trace
from tracer.format.model import MAX_PROBLEMS_PER_KIND

BEGIN, END, INSTANT, COUNTER = 1, 2, 3, 4
CLEARED, NEEDS_STATE = 1, 2


def setup(seq: int = 1, *, clear: bool = True) -> pb.TracePacket:
    packet = pb.TracePacket(trusted_packet_sequence_id=seq)
    if clear:
        packet.sequence_flags = CLEARED
    return packet


def track(uuid: int, name: str = "t", parent: int | None = None, seq: int = 1) -> pb.TracePacket:
    packet = pb.TracePacket(trusted_packet_sequence_id=seq)
    packet.track_descriptor.uuid = uuid
    packet.track_descriptor.name = name
    if parent is not None:
        packet.track_descriptor.parent_uuid = parent
    return packet


def counter_track(uuid: int, name: str = "c", multiplier: int = 0,
                  incremental: bool = False) -> pb.TracePacket:
    packet = track(uuid, name)
    packet.track_descriptor.counter.unit = pb.CounterDescriptor.UNIT_COUNT
    if multiplier:
        packet.track_descriptor.counter.unit_multiplier = multiplier
    if incremental:
        packet.track_descriptor.counter.is_incremental = True
    return packet


def event(kind: int, uuid: int | None, ts: int | None, seq: int | None = 1,
          name: str | None = None, **fields: object) -> pb.TracePacket:
    packet = pb.TracePacket()
    if seq is not None:
        packet.trusted_packet_sequence_id = seq
    if ts is not None:
        packet.timestamp = ts
    e = packet.track_event
    e.type = kind  # type: ignore[assignment]
    if uuid is not None:
        e.track_uuid = uuid
    if name is not None:
        e.name = name
    for key, value in fields.items():
        if isinstance(value, list):
            getattr(e, key).extend(value)
        else:
            setattr(e, key, value)
    return packet


def names(packet: pb.TracePacket, **entries: int) -> pb.TracePacket:
    for name, iid in entries.items():
        packet.interned_data.event_names.add(iid=iid, name=name)
    return packet


def kinds(data: bytes) -> list[str]:
    return [p.kind for p in read_trace(data).problems]


def bundle(*packets: pb.TracePacket, compress: Callable[[bytes], bytes] = zlib.compress,
           ) -> pb.TracePacket:
    return pb.TracePacket(compressed_packets=compress(trace_bytes(*packets)))


# ------------------------------------------------------------- every problem kind

def _bad_framing() -> bytes:
    return trace_bytes(setup(), track(1)) + b"\x00garbage"


def _bad_packet() -> bytes:
    return trace_bytes(setup(), track(1)) + b"\x0a\x03\xff\xff\xff" + trace_bytes(track(2))


def _bad_bundle() -> bytes:
    return trace_bytes(setup(), pb.TracePacket(compressed_packets=b"this is not zlib"))


def _missing_sequence_id() -> bytes:
    return trace_bytes(setup(), track(1), event(INSTANT, 1, 5, seq=None, name="x"))


def _not_cleared() -> bytes:
    return trace_bytes(setup(clear=False), track(1), names(event(BEGIN, 1, 5, name_iid=1), x=1))


def _unknown_iid() -> bytes:
    return trace_bytes(setup(), track(1), event(INSTANT, 1, 5, name_iid=3))


def _iid_redefined() -> bytes:
    return trace_bytes(setup(), track(1), names(event(INSTANT, 1, 5, name_iid=1), a=1),
                       names(event(INSTANT, 1, 6, name_iid=1), b=1))


def _bad_timestamp() -> bytes:
    return trace_bytes(setup(), track(1), event(INSTANT, 1, None, name="no timestamp"))


def _bad_descriptor() -> bytes:
    packet = track(1)
    packet.track_descriptor.thread.pid = 5  # no tid
    return trace_bytes(setup(), packet)


def _undeclared_track() -> bytes:
    return trace_bytes(setup(), track(1), event(INSTANT, 99, 5, name="x"))


def _track_redefined() -> bytes:
    return trace_bytes(setup(), track(1, "a"), track(1, "b"))


def _counter_before_descriptor() -> bytes:
    return trace_bytes(setup(), event(COUNTER, 3, 5, counter_value=1), counter_track(3))


def _counter_on_non_counter_track() -> bytes:
    return trace_bytes(setup(), track(1), event(COUNTER, 1, 5, counter_value=1))


def _counter_missing_value() -> bytes:
    return trace_bytes(setup(), counter_track(3), event(COUNTER, 3, 5))


def _extra_counter_mismatch() -> bytes:
    return trace_bytes(setup(), counter_track(3), counter_track(4),
                       event(COUNTER, 3, 5, counter_value=1, extra_counter_values=[1, 2],
                             extra_counter_track_uuids=[4]))


def _slice_on_counter_track() -> bytes:
    return trace_bytes(setup(), counter_track(3), event(BEGIN, 3, 5, name="x"),
                       event(END, 3, 6))


def _unmatched_end() -> bytes:
    return trace_bytes(setup(), track(1), event(END, 1, 5))


def _misplaced_end() -> bytes:
    return trace_bytes(setup(), track(1), event(BEGIN, 1, 5, name="a"),
                       event(BEGIN, 1, 6, name="b"), event(END, 1, 7, name="a"),
                       event(END, 1, 8))


def _unterminated_slice() -> bytes:
    return trace_bytes(setup(), track(1), event(BEGIN, 1, 5, name="open"))


def _flow_end_without_start() -> bytes:
    return trace_bytes(setup(), track(1), event(INSTANT, 1, 5, name="x",
                                                terminating_flow_ids=[42]))


def _unsupported_event() -> bytes:
    return trace_bytes(setup(), track(1), event(0, 1, 5, name="x"))


BAD_TRACES: dict[str, Callable[[], bytes]] = {
    "bad_framing": _bad_framing,
    "bad_packet": _bad_packet,
    "bad_bundle": _bad_bundle,
    "missing_sequence_id": _missing_sequence_id,
    "not_cleared": _not_cleared,
    "unknown_iid": _unknown_iid,
    "iid_redefined": _iid_redefined,
    "bad_timestamp": _bad_timestamp,
    "bad_descriptor": _bad_descriptor,
    "undeclared_track": _undeclared_track,
    "track_redefined": _track_redefined,
    "counter_before_descriptor": _counter_before_descriptor,
    "counter_on_non_counter_track": _counter_on_non_counter_track,
    "counter_missing_value": _counter_missing_value,
    "extra_counter_mismatch": _extra_counter_mismatch,
    "slice_on_counter_track": _slice_on_counter_track,
    "unmatched_end": _unmatched_end,
    "misplaced_end": _misplaced_end,
    "unterminated_slice": _unterminated_slice,
    "flow_end_without_start": _flow_end_without_start,
    "unsupported_event": _unsupported_event,
}


def test_every_problem_kind_has_a_trace_here() -> None:
    assert set(BAD_TRACES) == set(typing.get_args(ProblemKind))


@pytest.mark.parametrize("kind", sorted(BAD_TRACES))
def test_each_problem_is_reported_and_strict_mode_raises(kind: str) -> None:
    data = BAD_TRACES[kind]()
    model = read_trace(data)
    assert kind in [p.kind for p in model.problems]
    assert model.problem_counts[kind] >= 1
    problem = next(p for p in model.problems if p.kind == kind)
    assert problem.message and problem.offset is not None and problem.offset < len(data)
    assert kind in str(problem)
    with pytest.raises(TraceReadError, match=kind):
        read_trace(data, strict=True)


def test_a_clean_trace_has_no_problem() -> None:
    data = trace_bytes(setup(), track(1), counter_track(3),
                       names(event(BEGIN, 1, 5, name_iid=1), task=1),
                       event(COUNTER, 3, 6, counter_value=2), event(END, 1, 7))
    model = read_trace(data, strict=True)
    assert model.problems == [] and model.problem_counts == {}


# ------------------------------------------------------------ what each problem does

def test_interned_data_before_clear_is_ignored_then_works_after_clear() -> None:
    data = trace_bytes(
        setup(clear=False),
        track(1),
        names(event(INSTANT, 1, 5, name_iid=1), early=1),
        setup(),  # the clear
        names(event(INSTANT, 1, 6, name_iid=1), late=1),
    )
    model = read_trace(data)
    assert [i.name for i in model.instants] == [None, "late"]
    assert [p.kind for p in model.problems] == ["not_cleared", "not_cleared"]
    assert "SEQ_INCREMENTAL_STATE_CLEARED" in model.problems[0].message


def test_packets_needing_incremental_state_are_dropped_before_clear() -> None:
    needs = event(INSTANT, 1, 5, name="x")
    needs.sequence_flags = NEEDS_STATE
    data = trace_bytes(setup(clear=False), track(1), needs, setup(), needs)
    model = read_trace(data)
    assert [i.ts for i in model.instants] == [5]
    assert [p.kind for p in model.problems] == ["not_cleared"]


def test_previous_packet_dropped_invalidates_interning_until_the_next_clear() -> None:
    """As in trace_processor: known iids still resolve, new interned data is ignored."""
    lost = names(event(INSTANT, 1, 6, name_iid=2), b=2)
    lost.previous_packet_dropped = 1
    data = trace_bytes(setup(), track(1), names(event(INSTANT, 1, 5, name_iid=1), a=1), lost,
                       event(INSTANT, 1, 7, name_iid=1),
                       setup(), names(event(INSTANT, 1, 8, name_iid=2), c=2))
    model = read_trace(data)
    assert [i.name for i in model.instants] == ["a", None, "a", "c"]
    assert [p.kind for p in model.problems] == ["not_cleared", "not_cleared"]


def test_a_redefined_iid_keeps_its_first_definition() -> None:
    model = read_trace(_iid_redefined())
    assert [i.name for i in model.instants] == ["a", "a"]
    assert "'b'" in model.problems[0].message and "'a'" in model.problems[0].message


def test_unknown_iids_give_no_name_category_or_value() -> None:
    packet = event(INSTANT, 1, 5, name_iid=9, category_iids=[4])
    packet.track_event.debug_annotations.add(name="k", string_value_iid=5)
    packet.track_event.debug_annotations.add(name_iid=6, int_value=1)
    model = read_trace(trace_bytes(setup(), track(1), packet))
    (instant,) = model.instants
    assert (instant.name, instant.category, instant.args) == (None, None, {"k": None})
    assert [p.kind for p in model.problems] == ["unknown_iid"] * 4


def test_counter_events_need_their_descriptor_earlier_in_the_file() -> None:
    data = trace_bytes(setup(), event(COUNTER, 3, 5, counter_value=1), counter_track(3),
                       event(COUNTER, 3, 6, counter_value=2))
    model = read_trace(data)
    assert [(c.ts, c.value) for c in model.counters] == [(6, 2)]
    assert [p.kind for p in model.problems] == ["counter_before_descriptor"]


def test_a_counter_on_an_unknown_track_is_undeclared() -> None:
    model = read_trace(trace_bytes(setup(), event(COUNTER, 3, 5, counter_value=1)))
    assert model.counters == [] and [p.kind for p in model.problems] == ["undeclared_track"]


@pytest.mark.parametrize(
    ("values", "uuids", "defaults"),
    [
        ([1, 2], [4], []),  # fewer uuids than values
        ([1], [], []),  # no uuids at all
        ([1] * 9, list(range(4, 13)), []),  # over trace_processor's 8
        ([1], [1], []),  # an extra on a slice track
    ],
)
def test_bad_extra_counters_drop_the_whole_event(values, uuids, defaults) -> None:
    descriptors = [counter_track(u) for u in range(3, 13)]
    data = trace_bytes(setup(), track(1), *descriptors,
                       event(COUNTER, 3, 5, counter_value=7, extra_counter_values=values,
                             extra_counter_track_uuids=uuids))
    model = read_trace(data)
    assert model.counters == []
    assert len(model.problems) == 1


def test_extra_counters_from_event_or_defaults() -> None:
    defaults = setup(seq=2)
    defaults.trace_packet_defaults.track_event_defaults.track_uuid = 3
    defaults.trace_packet_defaults.track_event_defaults.extra_counter_track_uuids.extend([4, 5])
    defaults.trace_packet_defaults.track_event_defaults.extra_double_counter_track_uuids.append(6)
    data = trace_bytes(
        setup(), counter_track(3), counter_track(4, multiplier=10), counter_track(5),
        counter_track(6), track(1), defaults,
        event(COUNTER, None, 5, seq=2, counter_value=1, extra_counter_values=[2, 3],
              extra_double_counter_values=[0.5]),
        event(COUNTER, None, 6, seq=2, counter_value=4, extra_counter_values=[5],
              extra_counter_track_uuids=[5]),
        # Extra counters on a slice event count too.
        event(INSTANT, 1, 7, seq=1, name="i", extra_counter_values=[8],
              extra_counter_track_uuids=[4]),
    )
    model = read_trace(data, strict=True)
    assert [(c.ts, c.track_uuid, c.value) for c in model.counters] == [
        (5, 3, 1), (5, 4, 20), (5, 5, 3), (5, 6, 0.5), (6, 3, 4), (6, 5, 5), (7, 4, 80)]
    assert len(model.instants) == 1


def test_counter_on_a_slice_track_and_slices_on_a_counter_track_are_dropped() -> None:
    model = read_trace(_counter_on_non_counter_track())
    assert model.counters == []
    model = read_trace(_slice_on_counter_track())
    assert model.slices == [] and [p.kind for p in model.problems] == ["slice_on_counter_track"]


def test_unbalanced_begin_end() -> None:
    model = read_trace(trace_bytes(setup(), track(1), event(END, 1, 4),
                                   event(BEGIN, 1, 5, name="a"), event(END, 1, 6),
                                   event(END, 1, 7), event(BEGIN, 1, 8, name="open")))
    assert [(s.name, s.dur) for s in model.slices] == [("a", 1), ("open", None)]
    assert [p.kind for p in model.problems] == ["unmatched_end", "unmatched_end",
                                                 "unterminated_slice"]


def test_an_end_naming_its_slice_closes_the_innermost_match() -> None:
    model = read_trace(_misplaced_end())
    assert [(s.name, s.ts, s.dur) for s in model.slices] == [("a", 5, 2), ("b", 6, 2)]
    assert [p.kind for p in model.problems] == ["misplaced_end"]
    model = read_trace(trace_bytes(setup(), track(1), event(BEGIN, 1, 5, name="a"),
                                   event(END, 1, 6, name="zzz"), event(END, 1, 7)))
    assert [(s.name, s.dur) for s in model.slices] == [("a", 2)]
    assert [p.kind for p in model.problems] == ["unmatched_end"]


def test_events_on_undeclared_tracks_and_parents() -> None:
    model = read_trace(trace_bytes(setup(), track(1, parent=42), event(INSTANT, 99, 5, name="x"),
                                   event(INSTANT, 99, 6, name="y"), event(INSTANT, None, 7)))
    assert model.instants == []
    messages = [p.message for p in model.problems]
    assert all(p.kind == "undeclared_track" for p in model.problems)
    assert len(messages) == 3  # one per undeclared uuid, one for the parent, one with no uuid
    assert any("42" in m for m in messages) and any("99" in m for m in messages)


@pytest.mark.parametrize(
    "descriptor",
    [{}, {"thread": {"pid": 5}}, {"thread": {"tid": 5}}, {"process": {"process_name": "p"}}],
)
def test_descriptors_trace_processor_rejects(descriptor) -> None:
    packet = pb.TracePacket(trusted_packet_sequence_id=1)
    packet.track_descriptor.name = "x"
    if "thread" in descriptor or "process" in descriptor:
        packet.track_descriptor.uuid = 1
    for key, fields in descriptor.items():
        getattr(packet.track_descriptor, key).SetInParent()
        for name, value in fields.items():
            setattr(getattr(packet.track_descriptor, key), name, value)
    model = read_trace(trace_bytes(setup(), packet))
    assert model.tracks == {}
    assert [p.kind for p in model.problems] == ["bad_descriptor"]


def test_a_redescribed_track_keeps_its_first_description() -> None:
    model = read_trace(_track_redefined())
    assert model.tracks[1].name == "a"
    same = read_trace(trace_bytes(setup(), track(1, "a"), track(1, "a")))
    assert same.problems == []


def test_trackevent_without_sequence_id_is_dropped() -> None:
    orphan = names(event(INSTANT, 1, 5, seq=None, name="x"), y=1)
    model = read_trace(trace_bytes(setup(), track(1), orphan))
    assert model.instants == []
    assert [p.kind for p in model.problems] == ["missing_sequence_id", "missing_sequence_id"]


@pytest.mark.parametrize(
    ("clock", "ts"),
    [(3, 5), (1, 5), (64, 5), (70, 5), (0, (1 << 64) - 1)],
)
def test_timestamps_that_cannot_be_converted_drop_the_packet(clock: int, ts: int) -> None:
    packet = event(INSTANT, 1, ts, name="x")
    if clock:
        packet.timestamp_clock_id = clock
    model = read_trace(trace_bytes(setup(), track(1), packet))
    assert model.instants == []
    assert [p.kind for p in model.problems] == ["bad_timestamp"]


def test_flows_that_end_without_a_start_draw_nothing() -> None:
    model = read_trace(_flow_end_without_start())
    assert model.flows == [] and len(model.instants) == 1


def test_undecodable_packets_are_skipped_and_reading_goes_on() -> None:
    model = read_trace(_bad_packet())
    assert set(model.tracks) == {1, 2}
    assert model.packet_count == 4


def test_garbage_after_packets_stops_reading_there() -> None:
    data = _bad_framing()
    model = read_trace(data)
    assert set(model.tracks) == {1}
    assert model.problems[0].offset == data.index(b"\x00garbage")


def test_problems_are_capped_per_kind_but_all_counted() -> None:
    many = MAX_PROBLEMS_PER_KIND + 50
    packets = [event(INSTANT, 1, 5 + i, name_iid=100 + i) for i in range(many)]
    model = read_trace(trace_bytes(setup(), track(1), *packets))
    assert len(model.problems) == MAX_PROBLEMS_PER_KIND
    assert model.problem_counts == {"unknown_iid": MAX_PROBLEMS_PER_KIND + 50}
    assert len(model.instants) == MAX_PROBLEMS_PER_KIND + 50


# -------------------------------------------------------------------- bundles

def test_bundles_are_read_like_the_packets_they_hold() -> None:
    inner = [setup(), track(1), names(event(BEGIN, 1, 5, name_iid=1), a=1), event(END, 1, 6)]
    plain = read_trace(trace_bytes(*inner), strict=True)
    bundled = read_trace(trace_bytes(bundle(*inner[:2]), bundle(*inner[2:])), strict=True)
    gzipped = read_trace(trace_bytes(bundle(*inner, compress=gzip.compress)), strict=True)
    assert bundled.slices == plain.slices == gzipped.slices
    assert bundled.packet_count == plain.packet_count == 4


def test_raw_deflate_and_broken_zlib_are_bad_bundles() -> None:
    def raw_deflate(data: bytes) -> bytes:
        compressor = zlib.compressobj(wbits=-15)
        return compressor.compress(data) + compressor.flush()

    data = trace_bytes(setup(), bundle(track(1), compress=raw_deflate), bundle(track(2)))
    model = read_trace(data)
    assert set(model.tracks) == {2}
    assert [p.kind for p in model.problems] == ["bad_bundle"]
    cut_stream = zlib.compress(trace_bytes(track(3)))[:-4]
    model = read_trace(trace_bytes(setup(), pb.TracePacket(compressed_packets=cut_stream)))
    assert [p.kind for p in model.problems] == ["bad_bundle"]
    assert "incomplete" in model.problems[0].message


def test_a_bundle_with_a_partial_record_keeps_its_complete_ones() -> None:
    payload = trace_bytes(track(1), track(2))[:-2]
    packet = pb.TracePacket(compressed_packets=zlib.compress(payload))
    model = read_trace(trace_bytes(setup(), packet))
    assert set(model.tracks) == {1}
    assert [p.kind for p in model.problems] == ["bad_bundle"]
    assert not model.truncated  # the file itself is complete


def test_zlib_bomb_raises() -> None:
    bomb = zlib.compress(b"\x0a\x00" * (33 * 1024 * 1024), 9)  # 66 MiB of empty packets
    assert len(bomb) < 200_000
    data = trace_bytes(setup(), pb.TracePacket(compressed_packets=bomb))
    with pytest.raises(TraceReadError, match="zlib bomb"):
        read_trace(data)
    small = trace_bytes(setup(), bundle(*[track(i) for i in range(1, 200)]))
    with pytest.raises(TraceReadError, match="max_bundle_size"):
        read_trace(small, max_bundle_size=1000)
    assert len(read_trace(small).tracks) == 199


def test_a_bundle_inside_a_bundle_raises() -> None:
    data = trace_bytes(setup(), bundle(track(1), bundle(track(2))))
    with pytest.raises(TraceReadError, match="inside a compressed bundle"):
        read_trace(data)


# ----------------------------------------------------------------- not a trace

@pytest.mark.unchecked_traces("not a trace, on purpose")
def test_an_empty_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.perfetto-trace"
    path.write_bytes(b"")
    for source in (path, str(path), b""):
        with pytest.raises(TraceReadError, match="empty file"):
            read_trace(source)


@pytest.mark.unchecked_traces("not a trace, on purpose")
@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"hello, this is a text file\n", "looks like text"),
        (b"\nstarts with a newline but is text, long enough to be a record\n" * 3, "not a"),
        (b'{"traceEvents": []}', "JSON"),
        (b'[{"ph": "X"}]', "JSON"),
        (gzip.compress(b"hello, gzip-compressed text\n"), "looks like text"),  # gunzipped
        (b"\x28\xb5\x2f\xfd\x00\x00", "zstd"),
        (b"\x0a\x02\x08\x01", "no TracePacket field"),  # decodes, but only unknown fields
        (b"\x0a\x03\xff\xff\xff", "does not decode"),
        (b"\x0a\x20\x07\x07", "neither complete nor the start"),
        (b"\x0a" + b"\xff" * 11, "longer than 10 bytes"),
    ],
)
def test_not_a_trace_raises_a_clear_error(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "file"
    path.write_bytes(content)
    with pytest.raises(TraceReadError, match="not a Perfetto protobuf trace") as info:
        read_trace(path)
    assert reason in str(info.value)
    assert str(path) in str(info.value)


def test_a_gzipped_trace_reads_from_bytes_and_files(tmp_path: Path) -> None:
    inner = [setup(), track(1), names(event(BEGIN, 1, 5, name_iid=1), a=1), event(END, 1, 6)]
    data = trace_bytes(*inner)
    path = tmp_path / "t.perfetto-trace.gz"
    path.write_bytes(gzip.compress(data))
    plain = read_trace(data, strict=True)
    assert read_trace(gzip.compress(data), strict=True).slices == plain.slices
    assert read_trace(path, strict=True).slices == plain.slices


def test_random_bytes_are_not_a_trace() -> None:
    rng = random.Random(1234)
    for size in (1, 2, 3, 10, 100, 1000, 100_000):
        for _ in range(20):
            data = bytes(rng.getrandbits(8) for _ in range(size))
            if data[0] == 0x0A:
                data = b"\x00" + data[1:]
            with pytest.raises(TraceReadError):
                read_trace(data)
    # Starting with the record tag does not make random bytes a trace either.
    for _ in range(200):
        data = b"\x0a" + bytes(rng.getrandbits(8) for _ in range(rng.randrange(20, 2000)))
        try:
            model = read_trace(data)
        except TraceReadError:
            continue
        # A rare random record that happens to decode: it must not look like content.
        assert not model.slices and not model.counters


def test_missing_file_and_folder_raise_trace_read_error(tmp_path: Path) -> None:
    with pytest.raises(TraceReadError, match="cannot read"):
        read_trace(tmp_path / "missing.perfetto-trace")
    with pytest.raises(TraceReadError, match="cannot read"):
        read_trace(tmp_path)
    assert issubclass(TraceReadError, TracerError)


# ----------------------------------------- import rules the reader follows (no problem)

def test_defaults_give_track_and_clock_and_deltas_follow_the_incremental_clock() -> None:
    t0 = 1_000_000
    first = setup()
    first.clock_snapshot.clocks.add(clock_id=6, timestamp=t0)
    first.clock_snapshot.clocks.add(clock_id=64, timestamp=t0, is_incremental=True)
    first.trace_packet_defaults.timestamp_clock_id = 64
    first.trace_packet_defaults.track_event_defaults.track_uuid = 1
    late = event(INSTANT, None, t0 + 1, name="late")
    late.timestamp_clock_id = 6
    descriptor_with_ts = track(2)
    descriptor_with_ts.timestamp = 100  # advances the chain too
    data = trace_bytes(
        first, track(1), event(BEGIN, None, 10, name="a"), late, event(END, None, 5),
        descriptor_with_ts, event(INSTANT, 2, 1, name="after"),
    )
    model = read_trace(data, strict=True)
    assert [(s.ts, s.dur, s.track_uuid) for s in model.slices] == [(t0 + 10, 5, 1)]
    assert [(i.name, i.ts) for i in model.instants] == [("late", t0 + 1), ("after", t0 + 116)]


def test_clock_snapshots_convert_other_clocks_and_units() -> None:
    first = setup()
    clocks = first.clock_snapshot.clocks
    clocks.add(clock_id=6, timestamp=5_000)
    clocks.add(clock_id=1, timestamp=1_000_000_005_000)  # REALTIME
    clocks.add(clock_id=64, timestamp=5, is_incremental=True, unit_multiplier_ns=1000)
    realtime = event(INSTANT, 1, 1_000_000_007_000, name="realtime")
    realtime.timestamp_clock_id = 1
    micros = event(INSTANT, 1, 3, name="micros")
    micros.timestamp_clock_id = 64
    data = trace_bytes(first, track(1), realtime, micros, micros)
    model = read_trace(data, strict=True)
    assert [(i.name, i.ts) for i in model.instants] == [
        ("realtime", 7_000), ("micros", 8_000), ("micros", 11_000)]
    assert model.trace_clock == 6


def test_primary_trace_clock_changes_the_trace_clock() -> None:
    first = setup()
    first.clock_snapshot.primary_trace_clock = pb.BUILTIN_CLOCK_MONOTONIC
    first.clock_snapshot.clocks.add(clock_id=3, timestamp=100)
    first.clock_snapshot.clocks.add(clock_id=6, timestamp=1100)
    boot = event(INSTANT, 1, 1500, name="boot")
    boot.timestamp_clock_id = 6
    model = read_trace(trace_bytes(first, track(1), boot, event(INSTANT, 1, 42, name="raw")),
                       strict=True)
    assert model.trace_clock == 3
    assert [(i.name, i.ts) for i in model.instants] == [("raw", 42), ("boot", 500)]


def test_deprecated_incremental_state_cleared_is_honoured() -> None:
    first = pb.TracePacket(trusted_packet_sequence_id=1, incremental_state_cleared=True)
    model = read_trace(trace_bytes(first, track(1), names(event(INSTANT, 1, 5, name_iid=1), a=1)),
                       strict=True)
    assert model.instants[0].name == "a"


def test_each_sequence_has_its_own_interning() -> None:
    data = trace_bytes(setup(1), setup(2), track(1),
                       names(event(INSTANT, 1, 5, seq=1, name_iid=1), one=1),
                       names(event(INSTANT, 1, 6, seq=2, name_iid=1), two=1),
                       event(INSTANT, 1, 7, seq=1, name_iid=1))
    assert [i.name for i in read_trace(data, strict=True).instants] == ["one", "two", "one"]


def test_categories_annotations_and_old_flow_fields() -> None:
    source = event(BEGIN, 1, 5, name="src", category_iids=[1], categories=["inline"],
                   flow_ids_old=[7])
    source.interned_data.event_categories.add(iid=1, name="interned")
    ann = source.track_event.debug_annotations
    ann.add(name="p", pointer_value=0xDEAD)
    ann.add(name="j", legacy_json_value='{"a": 1}')
    ann.add(name="u", uint_value=(1 << 64) - 1)
    ann.add(name_iid=1, string_value_iid=1)
    source.interned_data.debug_annotation_names.add(iid=1, name="interned.name[0]")
    source.interned_data.debug_annotation_string_values.add(iid=1, str="caf\u00e9".encode())
    # The varint (_old) flow fields are read only when the fixed64 field is absent.
    end = event(END, 1, 6, flow_ids=[8], flow_ids_old=[99])
    dest = event(BEGIN, 1, 7, name="dst", terminating_flow_ids_old=[7])
    mark = event(INSTANT, 1, 8, name="mark", terminating_flow_ids=[8],
                 terminating_flow_ids_old=[99])
    data = trace_bytes(setup(), track(1), source, end, dest, mark, event(END, 1, 9))
    model = read_trace(data, strict=True)
    src, dst = model.slices
    (instant,) = model.instants
    assert src.category == "interned,inline"
    assert src.args == {"p": 0xDEAD, "j": '{"a": 1}', "u": (1 << 64) - 1,
                        "interned.name[0]": "caf\u00e9"}
    assert src.flow_ids_out == (7, 8) and dst.flow_ids_in == (7,)
    assert instant.flow_ids_in == (8,)
    assert sorted((f.flow_id, f.source_id, f.dest_id) for f in model.flows) == [
        (7, src.id, dst.id), (8, src.id, instant.id)]


def test_incremental_counters_accumulate_per_sequence_and_reset_on_clear() -> None:
    data = trace_bytes(setup(), counter_track(3, incremental=True, multiplier=2),
                       event(COUNTER, 3, 5, counter_value=1), event(COUNTER, 3, 6, counter_value=4),
                       setup(), event(COUNTER, 3, 7, counter_value=1))
    model = read_trace(data, strict=True)
    assert [c.value for c in model.counters] == [2, 10, 2]


def test_thread_and_process_tracks_form_the_track_tree() -> None:
    process = track(1, "descriptor name")
    process.track_descriptor.process.pid = 10
    process.track_descriptor.process.process_name = "Scheduler"
    thread = track(2, "ignored")
    thread.track_descriptor.thread.pid = 10
    thread.track_descriptor.thread.tid = 11
    thread.track_descriptor.thread.thread_name = "loop"
    data = trace_bytes(setup(), process, thread, track(3, "lane", parent=2),
                       track(4, "top"), counter_track(5, "mem"))
    model = read_trace(data, strict=True)
    assert model.tracks[1].name == "Scheduler" and model.tracks[2].name == "loop"
    assert model.track_path(3) == ["Scheduler", "loop", "lane"]
    assert [t.uuid for t in model.children()] == [1, 4, 5]
    assert [t.uuid for t in model.children(1)] == [2]
    assert [(depth, t.uuid) for depth, t in model.walk()] == [(0, 1), (1, 2), (2, 3), (0, 4),
                                                              (0, 5)]


def test_late_events_are_parsed_in_timestamp_order() -> None:
    """trace_processor sorts before nesting: a late slice before an open one is its sibling."""
    first = setup()
    data = trace_bytes(first, track(1), event(BEGIN, 1, 100, name="open"),
                       event(BEGIN, 1, 10, name="late"), event(END, 1, 20),
                       event(END, 1, 200))
    model = read_trace(data, strict=True)
    assert [(s.name, s.ts, s.dur, s.depth, s.parent_id) for s in model.slices] == [
        ("late", 10, 10, 0, None), ("open", 100, 100, 0, None)]


# ------------------------------------------------------------------ untrusted input

def test_nesting_past_protobufs_limit_is_a_bad_packet_not_a_crash() -> None:
    deep = event(INSTANT, 1, 5, name="deep")
    annotation = deep.track_event.debug_annotations.add(name="d")
    for _ in range(300):
        annotation = annotation.dict_entries.add(name="k")
    annotation.int_value = 1
    payload = deep.SerializeToString()  # framed by hand: Trace(packet=...) would re-parse it
    length = bytearray()
    n = len(payload)
    while n > 0x7F:
        length.append((n & 0x7F) | 0x80)
        n >>= 7
    length.append(n)
    data = (trace_bytes(setup(), track(1)) + b"\x0a" + bytes(length) + payload
            + trace_bytes(event(INSTANT, 1, 6, name="after")))
    model = read_trace(data)
    assert [i.name for i in model.instants] == ["after"]
    assert [p.kind for p in model.problems] == ["bad_packet"]


def _small_trace(compress: bool) -> bytes:
    import tempfile

    from trace_helpers import FakeClock

    from tracer.format import TraceWriter

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.perfetto-trace"
        with TraceWriter(path, clock=FakeClock(1000), compress=compress, buffer_size=1024) as w:
            lane = w.track("lane")
            counter = w.counter_track("c", unit_multiplier=2)
            sequence = w.counter_sequence([counter, w.counter_track("d")])
            for i in range(20):
                flow = w.new_flow_id()
                w.begin(lane, f"n{i % 3}", 1000 + 10 * i, args={"a": i, "d": {"k": [1, "v"]}},
                        flows=[flow])
                w.instant(lane, "i", 1000 + 10 * i + 1, terminating_flows=[flow])
                w.counter(counter, i, 1000 + 10 * i + 2)
                sequence.sample(1000 + 10 * i + 3, i, -i)
                w.end(lane, 1000 + 10 * i + 5)
        return path.read_bytes()


SMALL_TRACES = {False: _small_trace(False), True: _small_trace(True)}


@settings(max_examples=300, deadline=None)
@given(
    compress=st.booleans(),
    edits=st.lists(
        st.tuples(st.sampled_from(["set", "delete", "insert", "cut"]), st.integers(0, 1 << 16),
                  st.binary(min_size=1, max_size=8)),
        min_size=1, max_size=6),
    strict=st.booleans(),
)
def test_damaged_traces_never_raise_anything_but_trace_read_error(
    compress: bool, edits: list[tuple[str, int, bytes]], strict: bool
) -> None:
    data = bytearray(SMALL_TRACES[compress])
    for op, position, chunk in edits:
        at = position % (len(data) + 1)
        if op == "set" and data:
            data[at % len(data)] = chunk[0]
        elif op == "delete":
            del data[at : at + len(chunk)]
        elif op == "insert":
            data[at:at] = chunk
        else:
            del data[at:]
    try:
        model = read_trace(bytes(data), strict=strict)
    except TraceReadError:
        return
    assert model.packet_count >= 0


def test_repeated_packets_with_a_second_timestamp_field_read_like_protobuf() -> None:
    """The reader reuses the decoding of repeated packets; a later timestamp field
    in the packet (protobuf keeps the last one) must not fool it."""
    tail = event(INSTANT, 1, None, name="x").SerializeToString() + b"\x40\x07"

    def record(first_ts: int) -> bytes:
        body = b"\x40" + bytes([first_ts]) + tail
        return b"\x0a" + bytes([len(body)]) + body

    data = trace_bytes(setup(), track(1)) + record(7) + record(9) + record(20)
    assert [i.ts for i in read_trace(data, strict=True).instants] == [7, 7, 7]

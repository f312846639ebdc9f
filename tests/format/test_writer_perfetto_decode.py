"""What TraceWriter writes, decoded with the perfetto package's own schema.

These tests do not use our subset pb2 or our reader: every packet is decoded
with ``perfetto.protos...perfetto_trace_pb2`` and checked field by field
against the format reference (/work/shared/perfetto-format.md).
"""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pf
from trace_helpers import FakeClock, records

from tracer.format import TraceWriter

T0 = 5_000_000_000
TE = pf.TrackEvent
SEQ_INCREMENTAL_STATE_CLEARED = pf.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED


def decode(path: Path) -> list[Any]:
    return list(pf.Trace.FromString(path.read_bytes()).packet)


def events(packets: list[Any]) -> list[Any]:
    return [p for p in packets if p.HasField("track_event")]


def descriptors(packets: list[Any]) -> dict[int, Any]:
    return {p.track_descriptor.uuid: p for p in packets if p.HasField("track_descriptor")}


def absolute_times(packets: list[Any], t0: int = T0) -> list[int]:
    """Trace time of each timestamped packet: clock 64 deltas summed from t0, or BOOTTIME."""
    now = t0
    out = []
    for p in packets:
        if not p.HasField("timestamp"):
            continue
        if p.HasField("timestamp_clock_id"):
            assert p.timestamp_clock_id == 6
            out.append(p.timestamp)
        else:
            now += p.timestamp
            out.append(now)
    return out


class Interned:
    """The interned tables of sequence 1, accumulated over the packets (an independent decoder)."""

    def __init__(self, packets: list[Any]) -> None:
        self.names: dict[int, str] = {}
        self.categories: dict[int, str] = {}
        self.arg_names: dict[int, str] = {}
        self.strings: dict[int, bytes] = {}
        for p in packets:
            data = p.interned_data
            for e in data.event_names:
                assert self.names.setdefault(e.iid, e.name) == e.name
            for e in data.event_categories:
                assert self.categories.setdefault(e.iid, e.name) == e.name
            for e in data.debug_annotation_names:
                assert self.arg_names.setdefault(e.iid, e.name) == e.name
            for e in data.debug_annotation_string_values:
                assert self.strings.setdefault(e.iid, e.str) == e.str

    def args(self, event: Any) -> dict[str, Any]:
        return {self.arg_name(a): self.value(a) for a in event.debug_annotations}

    def arg_name(self, ann: Any) -> str:
        return self.arg_names[ann.name_iid] if ann.HasField("name_iid") else ann.name

    def value(self, ann: Any) -> Any:
        which = ann.WhichOneof("value")
        if which == "string_value_iid":
            return self.strings[ann.string_value_iid].decode()
        if which is not None:
            return getattr(ann, which)
        if ann.dict_entries:
            return {self.arg_name(e): self.value(e) for e in ann.dict_entries}
        return [self.value(e) for e in ann.array_values]


def test_setup_packet_clock_snapshot_flags_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    before = time.time_ns()
    with TraceWriter(path, clock=FakeClock(T0)):
        pass
    after = time.time_ns()
    packets = decode(path)
    assert len(packets) == 1
    setup = packets[0]
    assert setup.trusted_packet_sequence_id == 1
    assert setup.sequence_flags == SEQ_INCREMENTAL_STATE_CLEARED
    assert not setup.HasField("timestamp")
    clocks = {c.clock_id: c for c in setup.clock_snapshot.clocks}
    assert set(clocks) == {pf.BUILTIN_CLOCK_BOOTTIME, pf.BUILTIN_CLOCK_REALTIME, 64}
    assert clocks[6].timestamp == T0 and not clocks[6].is_incremental
    assert clocks[64].timestamp == T0 and clocks[64].is_incremental
    assert not clocks[64].HasField("unit_multiplier_ns")
    # REALTIME is the wall clock when the writer started (the UI shows time of day).
    assert before <= clocks[1].timestamp <= after
    assert setup.trace_packet_defaults.timestamp_clock_id == 64


def test_default_clock_is_time_ns_and_realtime_equals_boottime_anchor(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    before = time.time_ns()
    with TraceWriter(path) as w:
        start = w.start_ts
    clocks = {c.clock_id: c.timestamp for c in decode(path)[0].clock_snapshot.clocks}
    assert before <= start <= time.time_ns()
    assert clocks == {6: start, 1: start, 64: start}


def test_sequence_id_is_on_every_packet(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0), sequence_id=77) as w:
        t = w.track("x")
        c = w.counter_track("c")
        w.begin(t, "a", T0 + 1, args={"k": 1})
        w.end(t, T0 + 2)
        w.counter(c, 3, T0 + 3)
    packets = decode(path)
    assert len(packets) == 6
    assert all(p.trusted_packet_sequence_id == 77 for p in packets)


def test_descriptors_of_every_track_kind(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        proc = w.process_track(4242, "Scheduler", rank=2)
        thread = w.thread_track(4242, 4243, "dispatch loop", rank=1)
        plain = w.track("Stages", child_ordering="explicit", description="all stages")
        nested = w.track("map", parent=plain, rank=5, merge=False)
        chrono = w.track("Tasks", parent=proc, child_ordering="chronological")
        lexi = w.track("Other", child_ordering="lexicographic")
        count = w.counter_track("tasks", parent=proc)
        mem = w.counter_track("memory", unit="bytes", unit_multiplier=1024, rank=3,
                              description="RSS", y_axis_share_key="mem")
        ns = w.counter_track("wait", unit="ns")
        named = w.counter_track("rate", unit=None, unit_name="rows/s")
    packets = decode(path)
    descs = descriptors(packets)
    uuids = [proc.uuid, thread.uuid, plain.uuid, nested.uuid, chrono.uuid, lexi.uuid,
             count.uuid, mem.uuid, ns.uuid, named.uuid]
    assert len(set(uuids)) == len(uuids) and 0 not in uuids
    assert max(uuids) < 128  # small sequential uuids keep events short
    assert set(descs) == {0, *uuids}
    for p in packets[1:]:
        assert p.HasField("track_descriptor")
        assert not p.HasField("timestamp")  # would advance the clock-64 delta chain
        assert p.trusted_packet_sequence_id == 1

    # The root descriptor (uuid 0) turns on explicit process/thread ordering,
    # once, before the first ranked process or thread.
    root_positions = [i for i, p in enumerate(packets) if p.HasField("track_descriptor")
                      and p.track_descriptor.uuid == 0]
    assert len(root_positions) == 1
    first_ranked = min(i for i, p in enumerate(packets) if p.HasField("track_descriptor")
                       and p.track_descriptor.uuid == proc.uuid)
    assert root_positions[0] < first_ranked
    root = descs[0].track_descriptor
    assert root.process_ordering == pf.TrackDescriptor.PROCESS_ORDERING_EXPLICIT
    assert root.thread_ordering == pf.TrackDescriptor.THREAD_ORDERING_EXPLICIT

    d = descs[proc.uuid].track_descriptor
    assert d.process.pid == 4242 and d.process.process_name == "Scheduler"
    assert d.sibling_order_rank == 2
    assert not d.HasField("thread") and not d.HasField("counter")

    d = descs[thread.uuid].track_descriptor
    assert (d.thread.pid, d.thread.tid, d.thread.thread_name) == (4242, 4243, "dispatch loop")
    assert not d.HasField("parent_uuid")  # the thread descriptor carries the association
    assert d.sibling_order_rank == 1

    d = descs[plain.uuid].track_descriptor
    assert d.name == "Stages" and not d.HasField("parent_uuid")
    assert d.child_ordering == pf.TrackDescriptor.EXPLICIT
    assert d.description == "all stages"
    assert not d.HasField("sibling_merge_behavior")

    d = descs[nested.uuid].track_descriptor
    assert d.name == "map" and d.parent_uuid == plain.uuid and d.sibling_order_rank == 5
    assert d.sibling_merge_behavior == pf.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_NONE

    d = descs[chrono.uuid].track_descriptor
    assert d.parent_uuid == proc.uuid and d.child_ordering == pf.TrackDescriptor.CHRONOLOGICAL
    assert descs[lexi.uuid].track_descriptor.child_ordering == pf.TrackDescriptor.LEXICOGRAPHIC

    CD = pf.CounterDescriptor
    d = descs[count.uuid].track_descriptor
    assert d.name == "tasks" and d.parent_uuid == proc.uuid
    assert d.counter.unit == CD.UNIT_COUNT and not d.counter.HasField("unit_multiplier")
    d = descs[mem.uuid].track_descriptor
    assert d.counter.unit == CD.UNIT_SIZE_BYTES and d.counter.unit_multiplier == 1024
    assert d.sibling_order_rank == 3 and d.description == "RSS"
    assert d.counter.y_axis_share_key == "mem"
    assert descs[ns.uuid].track_descriptor.counter.unit == CD.UNIT_TIME_NS
    d = descs[named.uuid].track_descriptor
    assert not d.counter.HasField("unit") and d.counter.unit_name == "rows/s"


def test_begin_end_instant_counter_and_interned_names(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        t = w.track("lane")
        ints = w.counter_track("ints")
        doubles = w.counter_track("doubles", dedupe=False)
        w.begin(t, "task", T0 + 1500, category="cat")
        w.instant(t, "mark", T0 + 1600)
        w.end(t, T0 + 1700)
        w.begin(t, "task", T0 + 1800, category="cat")  # second use: interned
        w.end(t, T0 + 1900)
        w.counter(ints, 7, T0 + 2000)
        w.counter(ints, 7, T0 + 2100)  # equal to the previous sample: deduped
        w.counter(ints, -3, T0 + 2200)
        w.counter(doubles, 0.5, T0 + 2300)
        w.counter(doubles, 0.5, T0 + 2400)  # dedupe=False keeps it
    packets = decode(path)
    evs = events(packets)
    assert [e.track_event.type for e in evs] == [
        TE.TYPE_SLICE_BEGIN, TE.TYPE_INSTANT, TE.TYPE_SLICE_END, TE.TYPE_SLICE_BEGIN,
        TE.TYPE_SLICE_END, TE.TYPE_COUNTER, TE.TYPE_COUNTER, TE.TYPE_COUNTER, TE.TYPE_COUNTER,
    ]
    assert absolute_times(packets) == [T0 + x for x in
                                       (1500, 1600, 1700, 1800, 1900, 2000, 2200, 2300, 2400)]
    assert all(not e.HasField("timestamp_clock_id") for e in evs)  # default clock 64
    assert all(e.trusted_packet_sequence_id == 1 for e in evs)
    first, mark, end, second, end2 = (e.track_event for e in evs[:5])
    assert {first.track_uuid, mark.track_uuid, end.track_uuid, second.track_uuid} == {t.uuid}

    # First use: the name and category are defined in the same packet.
    names = {n.name: n.iid for n in evs[0].interned_data.event_names}
    cats = {c.name: c.iid for c in evs[0].interned_data.event_categories}
    assert names == {"task": first.name_iid} and first.name_iid > 0
    assert cats == {"cat": first.category_iids[0]} and list(first.categories) == []
    assert not first.HasField("name")
    # Second use: only the iids.
    assert not evs[3].HasField("interned_data")
    assert second.name_iid == first.name_iid
    assert list(second.category_iids) == list(first.category_iids)
    assert mark.name_iid != first.name_iid
    # END carries no name, category or args.
    for e in (end, end2):
        assert not e.HasField("name_iid") and not e.HasField("name")
        assert list(e.category_iids) == [] and list(e.debug_annotations) == []

    counters = [e.track_event for e in evs[5:]]
    assert [c.track_uuid for c in counters] == [ints.uuid, ints.uuid, doubles.uuid, doubles.uuid]
    assert [c.WhichOneof("counter_value_field") for c in counters] == [
        "counter_value", "counter_value", "double_counter_value", "double_counter_value"]
    assert [counters[0].counter_value, counters[1].counter_value] == [7, -3]
    assert [counters[2].double_counter_value, counters[3].double_counter_value] == [0.5, 0.5]


@pytest.mark.parametrize("compress", [False, True])
def test_delta_chain_at_every_varint_width(tmp_path: Path, compress: bool) -> None:
    """Deltas at the edges of 1-, 2-, 3- and longer varints, on every event kind."""
    gaps = [0, 1, 127, 128, 16383, 16384, 2_097_151, 2_097_152, 268_435_455, 268_435_456,
            10**12, 5, 0]
    path = tmp_path / "t.perfetto-trace"
    expected = []
    with TraceWriter(path, clock=FakeClock(T0), compress=compress) as w:
        t = w.track("lane")
        c = w.counter_track("c", dedupe=False)
        now = T0
        for i, gap in enumerate(gaps * 4):
            now += gap
            kind = i % 4
            if kind == 0:
                w.begin(t, "s", now)
            elif kind == 1:
                w.instant(t, "i", now)
            elif kind == 2:
                w.end(t, now)
            else:
                w.counter(c, i, now)
            expected.append(now)
    packets = _inflated(path) if compress else decode(path)
    assert absolute_times(packets) == expected
    assert not any(p.HasField("timestamp_clock_id") for p in packets)


def test_clock_default_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    clock = FakeClock(T0, step=250)
    with TraceWriter(path, clock=clock) as w:
        t = w.track("lane")
        w.begin(t, "a")
        w.end(t)
        assert w.now() == T0 + 750
    assert absolute_times(decode(path)) == [T0 + 250, T0 + 500]


def test_interned_annotation_names_and_repeated_string_values(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    long = "L" * 300
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        t = w.track("lane")
        for i in range(4):
            w.instant(t, "e", T0 + i, args={"node": "node-1", "long": long})
    evs = events(decode(path))
    anns = [list(e.track_event.debug_annotations) for e in evs]
    name_iids = {n.name: n.iid for n in evs[0].interned_data.debug_annotation_names}
    assert set(name_iids) == {"node", "long"}
    for event_anns in anns:
        assert [a.name_iid for a in event_anns] == [name_iids["node"], name_iids["long"]]
        assert all(not a.HasField("name") for a in event_anns)
    assert not evs[1].interned_data.debug_annotation_names  # defined once
    # A string value is written inline twice (a value used twice is smaller
    # inline), interned from its third occurrence on.
    assert [a[0].string_value for a in anns[:2]] == ["node-1", "node-1"]
    assert not evs[0].interned_data.debug_annotation_string_values
    assert not evs[1].interned_data.debug_annotation_string_values
    strings = evs[2].interned_data.debug_annotation_string_values
    assert [(s.iid, s.str) for s in strings] == [(anns[2][0].string_value_iid, b"node-1")]
    assert anns[3][0].string_value_iid == anns[2][0].string_value_iid
    assert not evs[3].interned_data.debug_annotation_string_values
    # Long values are never interned.
    assert [a[1].string_value for a in anns] == [long] * 4


def test_interning_stops_at_intern_limit(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0), intern_limit=2) as w:
        t = w.track("lane")
        for i, name in enumerate(["a", "b", "c", "a", "c"]):
            w.instant(t, name, T0 + i)
    evs = [e.track_event for e in events(decode(path))]
    assert [e.HasField("name_iid") for e in evs] == [True, True, False, True, False]
    assert [evs[2].name, evs[4].name] == ["c", "c"]


def test_flows_are_fixed64(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        t = w.track("lane")
        f1, f2 = w.new_flow_id(), w.new_flow_id()
        assert 0 < f1 < f2
        big = (1 << 64) - 1
        w.begin(t, "src", T0 + 1, flows=[f1, big])
        w.end(t, T0 + 2, flows=[f2])
        w.begin(t, "dst", T0 + 3, terminating_flows=[f1, f2])
        w.instant(t, "i", T0 + 4, terminating_flows=[big])
        w.end(t, T0 + 5)
    data = path.read_bytes()
    evs = [e.track_event for e in events(decode(path))]
    assert list(evs[0].flow_ids) == [f1, big]
    assert list(evs[1].flow_ids) == [f2]
    assert list(evs[2].terminating_flow_ids) == [f1, f2]
    assert list(evs[3].terminating_flow_ids) == [big]
    for e in evs:
        assert list(e.flow_ids_old) == [] and list(e.terminating_flow_ids_old) == []
    # The wire form is fixed64: tag F9 02 / 81 03 and 8 little-endian bytes.
    assert b"\xf9\x02" + struct.pack("<Q", f1) in data
    assert b"\xf9\x02" + struct.pack("<Q", big) in data
    assert b"\x81\x03" + struct.pack("<Q", f2) in data


class Opaque:
    def __str__(self) -> str:
        return "opaque!"


def test_nested_annotations_and_value_types(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    args = {
        "task": {"id": 7, "resources": {"num_cpus": 1.5, "gpu": False}, "tags": ["a", 2, [3]]},
        "neg": -5,
        "int64_max": (1 << 63) - 1,
        "int64_min": -(1 << 63),
        "uint64": (1 << 64) - 1,
        "too_big": 1 << 70,
        "text": "hello",
        "flag": True,
        "tuple": (1, "x"),
        "opaque": Opaque(),
    }
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        t = w.track("lane")
        w.begin(t, "a", T0 + 1, args=args)
        w.end(t, T0 + 2, args={"result": "ok"})
    packets = decode(path)
    interned = Interned(packets)
    evs = [e.track_event for e in events(packets)]
    anns = {interned.arg_name(a): a for a in evs[0].debug_annotations}
    assert anns["neg"].WhichOneof("value") == "int_value"
    assert anns["int64_max"].WhichOneof("value") == "int_value"
    assert anns["int64_min"].int_value == -(1 << 63)
    assert anns["uint64"].WhichOneof("value") == "uint_value"
    assert anns["uint64"].uint_value == (1 << 64) - 1
    assert anns["too_big"].string_value == str(1 << 70)
    assert anns["flag"].WhichOneof("value") == "bool_value"
    task = anns["task"]
    assert task.WhichOneof("value") is None and len(task.dict_entries) == 3
    assert all(e.HasField("name_iid") for e in task.dict_entries)  # dict keys are interned
    tags = next(e for e in task.dict_entries if interned.arg_name(e) == "tags")
    assert all(not v.HasField("name_iid") and not v.HasField("name") for v in tags.array_values)
    assert interned.args(evs[0]) == {
        "task": {"id": 7, "resources": {"num_cpus": 1.5, "gpu": False}, "tags": ["a", 2, [3]]},
        "neg": -5,
        "int64_max": (1 << 63) - 1,
        "int64_min": -(1 << 63),
        "uint64": (1 << 64) - 1,
        "too_big": str(1 << 70),
        "text": "hello",
        "flag": True,
        "tuple": [1, "x"],
        "opaque": "opaque!",
    }
    assert interned.args(evs[1]) == {"result": "ok"}
    assert evs[1].type == TE.TYPE_SLICE_END


def test_late_events_use_absolute_boottime_and_leave_the_chain_alone(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        a = w.track("a")
        b = w.track("b")
        c = w.counter_track("c")
        w.begin(a, "now", T0 + 1000)
        w.complete(b, "late", T0 + 200, T0 + 400, args={"k": 1})
        w.instant(b, "late instant", T0 + 300)
        w.counter(c, 5, T0 + 250)
        w.end(a, T0 + 1500)
    packets = decode(path)
    evs = events(packets)
    late = evs[1:5]
    assert [p.timestamp for p in late] == [T0 + 200, T0 + 400, T0 + 300, T0 + 250]
    assert all(p.timestamp_clock_id == pf.BUILTIN_CLOCK_BOOTTIME for p in late)
    assert not evs[0].HasField("timestamp_clock_id") and evs[0].timestamp == 1000
    # The delta after the late events is still relative to the last in-order one.
    assert not evs[5].HasField("timestamp_clock_id") and evs[5].timestamp == 500
    assert absolute_times(packets) == [T0 + x for x in (1000, 200, 400, 300, 250, 1500)]


def test_late_events_held_in_time_order_are_deltas_on_a_second_clock(tmp_path: Path) -> None:
    """A ClockSnapshot of BOOTTIME and clock 65 (incremental; not 64: listing it would
    reset the delta chain) anchors the batch; its events carry timestamp_clock_id 65."""
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        a, b, c = w.track("a"), w.track("b"), w.track("c")
        w.begin(a, "now", T0 + 1000)
        with w.in_time_order():
            w.instant(b, "later", T0 + 300)
            w.instant(c, "earlier", T0 + 200)  # written first
        w.end(a, T0 + 1500)
    packets = decode(path)
    snapshot = next(p for p in packets[1:] if p.HasField("clock_snapshot"))
    clocks = [(c.clock_id, c.timestamp, c.is_incremental) for c in snapshot.clock_snapshot.clocks]
    assert clocks == [(pf.BUILTIN_CLOCK_BOOTTIME, T0 + 200, False), (65, T0 + 200, True)]
    assert snapshot.trusted_packet_sequence_id == packets[0].trusted_packet_sequence_id
    evs = events(packets)
    assert [(p.timestamp_clock_id, p.timestamp) for p in evs[1:3]] == [(65, 0), (65, 100)]
    assert [p.track_event.track_uuid for p in evs[1:3]] == [c.uuid, b.uuid]
    # The delta chain (clock 64, the default) goes on from its last event.
    assert not evs[-1].HasField("timestamp_clock_id") and evs[-1].timestamp == 500


def _inflated(path: Path) -> list[Any]:
    """Packets of a compressed trace: each outer packet is one whole-record bundle."""
    out = []
    for p in decode(path):
        assert [f.name for f, _ in p.ListFields()] == ["compressed_packets"]
        inner = zlib.decompress(p.compressed_packets)
        ends = 0
        for offset, payload in records(inner):
            ends = offset + len(payload) + 1 + len(_len_varint(len(payload)))
        assert ends == len(inner), "a bundle must hold whole records"
        out.extend(pf.Trace.FromString(inner).packet)
    return out


def _len_varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _script(w: TraceWriter) -> None:
    t = w.thread_track(1, 2, "loop")
    lanes = [w.track("task", parent=t) for _ in range(8)]
    c = w.counter_track("inflight")
    for i in range(400):
        lane = lanes[i % 8]
        w.begin(lane, "task", T0 + 10 * i, args={"task_id": f"t{i}", "attempt": i % 3})
        w.counter(c, i % 5, T0 + 10 * i + 1)
        w.end(lane, T0 + 10 * i + 5)


def test_compressed_bundles_hold_the_same_packets(tmp_path: Path) -> None:
    plain_path = tmp_path / "plain.perfetto-trace"
    packed_path = tmp_path / "packed.perfetto-trace"
    with TraceWriter(plain_path, clock=FakeClock(T0)) as w:
        _script(w)
    with TraceWriter(packed_path, clock=FakeClock(T0), compress=True, buffer_size=2048) as w:
        _script(w)
    plain = decode(plain_path)
    bundles = decode(packed_path)
    assert len(bundles) > 3  # small buffer: several bundles
    assert all(len(b.compressed_packets) < 4096 for b in bundles)
    packed = _inflated(packed_path)
    for packets in (plain, packed):  # the wall clock differs between the two runs
        for clock in packets[0].clock_snapshot.clocks:
            if clock.clock_id == pf.BUILTIN_CLOCK_REALTIME:
                clock.timestamp = 0
    assert [p.SerializeToString() for p in packed] == [p.SerializeToString() for p in plain]
    assert packed_path.stat().st_size < plain_path.stat().st_size / 2


def test_packet_sizes_match_the_reference(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        t = w.track("lane")
        c = w.counter_track("c")
        now = T0
        for i in range(20):
            now += 1500  # a 2-byte delta, as in the reference's examples
            w.begin(t, "dispatch", now)
            now += 300
            w.end(t, now)
            now += 40
            w.counter(c, 100 + i, now)
    data = path.read_bytes()
    sizes = []
    for offset, payload in records(data):
        sizes.append((pf.TracePacket.FromString(payload), offset))
    ends = [o for _, o in sizes[1:]] + [len(data)]
    by_kind: dict[int, list[int]] = {}
    for (p, offset), end in zip(sizes, ends, strict=True):
        if p.HasField("track_event") and not p.HasField("interned_data"):
            by_kind.setdefault(p.track_event.type, []).append(end - offset)
    begins, ends_, counters = (by_kind[k] for k in (1, 2, 4))
    assert len(begins) == 19 and len(ends_) == 20 and len(counters) == 20
    # Typical begin is 13-16 B and end 11-13 B; a counter is about 18 B.
    assert all(13 <= n <= 17 for n in begins), begins
    assert all(11 <= n <= 13 for n in ends_), ends_
    assert all(n <= 18 for n in counters), counters
    assert len(data) / 60 < 17

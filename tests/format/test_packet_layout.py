"""Where the writer puts a packet's timestamp, and that the reader takes either place.

The writer puts ``TracePacket.timestamp`` last: it is the part of a packet that
differs every time, and with it at the end zlib matches the rest of a packet
and the next one's head in one run (``compress=True`` files ~10% smaller).
Traces written before kept it first; they must read the same.
"""

from __future__ import annotations

from pathlib import Path

from trace_bytes import read_varint, uncompressed
from trace_helpers import FakeClock, content, records, trace_bytes, varint

from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.format import TraceWriter, read_trace

_TIMESTAMP = 8


def _fields(payload: bytes) -> list[tuple[int, bytes, bytes]]:
    """The top-level fields of a TracePacket: (number, whole encoding, value bytes)."""
    out = []
    pos = 0
    while pos < len(payload):
        start = pos
        tag, pos = read_varint(payload, pos)
        wire = tag & 7
        value_start = pos
        if wire == 0:
            _, pos = read_varint(payload, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, value_start = read_varint(payload, pos)
            pos = value_start + length
        elif wire == 5:
            pos += 4
        else:
            raise AssertionError(f"wire type {wire}")
        out.append((tag >> 3, payload[start:pos], payload[value_start:pos]))
    assert pos == len(payload)
    return out


def _preamble() -> bytes:
    """A sequence cleared, and track 1 declared."""
    setup = pb.TracePacket(trusted_packet_sequence_id=1, sequence_flags=1)
    track = pb.TracePacket(trusted_packet_sequence_id=1)
    track.track_descriptor.uuid = 1
    track.track_descriptor.name = "t"
    return trace_bytes(setup, track)


def _instant_packet() -> bytes:
    """An instant named "x" on track 1, without a timestamp (the tests add it)."""
    packet = pb.TracePacket(trusted_packet_sequence_id=1)
    packet.track_event.type = pb.TrackEvent.TYPE_INSTANT
    packet.track_event.track_uuid = 1
    packet.track_event.name = "x"
    return packet.SerializeToString()


def _write_everything(path: Path, compress: bool = False) -> None:
    """Every way the writer times a packet: cached and first events, args, flows,
    counters of each size, gaps of 1-3+ varint bytes, a late event, a counter sequence."""
    clock = FakeClock(1_000_000_000)
    with TraceWriter(path, clock=clock, compress=compress, buffer_size=1024) as w:
        loop = w.thread_track(10, 11, "loop")
        lane = w.track("lane")
        memory = w.counter_track("memory", unit="bytes")
        ratio = w.counter_track("ratio", unit="count")
        seq = w.counter_sequence([w.counter_track("late rss", unit="bytes")])
        t = 1_000_000_000
        for gap in (5, 100, 200, 20_000, 3_000_000, 40_000_000_000):
            for i in range(2):  # the first of each is a first occurrence, then cached
                t += gap
                w.begin(loop, "wave", t)
                w.instant(loop, "tick", t, category="c")
                w.counter(memory, gap * 1000 + i, t)
                w.counter(ratio, gap / 7 + i, t)
                w.begin(lane, "task", t, args={"task_id": f"t{gap}", "n": gap})
                flow = w.new_flow_id()
                w.end(lane, t + 1, args={"ok": True}, flows=[flow])
                w.end(loop, t + 2)
                t += 2
        w.instant(loop, "late", t - 10_000)  # before the previous event: absolute
        seq.sample(t, 123)
        seq.sample(t + 5000, 456)


def test_every_timestamped_packet_ends_with_its_timestamp(tmp_path: Path) -> None:
    for compress in (False, True):
        path = tmp_path / f"t{compress}.perfetto-trace"
        _write_everything(path, compress)
        timed = 0
        for _, payload in records(uncompressed(path.read_bytes())):
            numbers = [n for n, _, _ in _fields(payload)]
            if _TIMESTAMP in numbers:
                timed += 1
                assert numbers.count(_TIMESTAMP) == 1
                assert numbers[-1] == _TIMESTAMP, numbers
        assert timed >= 6 * 2 * 7 + 3


def _timestamp_first(data: bytes) -> bytes:
    """The same trace with every packet's timestamp moved to the front (the old layout)."""
    out = bytearray()
    for _, payload in records(data):
        fields = _fields(payload)
        ordered = [f for n, f, _ in fields if n == _TIMESTAMP] + [
            f for n, f, _ in fields if n != _TIMESTAMP
        ]
        body = b"".join(ordered)
        out += b"\x0a" + varint(len(body)) + body
    return bytes(out)


def test_traces_with_the_timestamp_first_read_the_same(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    _write_everything(path)
    data = path.read_bytes()
    old = _timestamp_first(data)
    assert old != data and len(old) == len(data)
    new_model = read_trace(data, strict=True)
    assert content(read_trace(old, strict=True)) == content(new_model)
    assert len(new_model.slices) == 6 * 2 * 2 and len(new_model.counters) >= 6 * 2 * 2


def test_repeated_packets_with_two_trailing_timestamp_fields_read_like_protobuf() -> None:
    """The reader reuses the decoding of repeated packets, keyed by the bytes before
    a trailing timestamp; an earlier timestamp field among them must not fool it
    (protobuf keeps the last one)."""
    head = _instant_packet() + b"\x40\x07"

    def record(last_ts: int) -> bytes:
        body = head + b"\x40" + varint(last_ts)
        return b"\x0a" + bytes([len(body)]) + body

    data = _preamble() + record(7) + record(9) + record(20_000)
    assert [i.ts for i in read_trace(data, strict=True).instants] == [7, 9, 20_000]


def test_repeated_packets_with_a_trailing_timestamp_replay_every_width() -> None:
    """One packet repeated with 1- to 4-byte timestamps: each read at its own time."""
    head = _instant_packet()
    stamps = [5, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 3, 300]
    data = _preamble() + b"".join(
        b"\x0a" + bytes([len(head) + 1 + len(varint(ts))]) + head + b"\x40" + varint(ts)
        for ts in stamps
    )
    assert [i.ts for i in read_trace(data, strict=True).instants] == sorted(stamps)

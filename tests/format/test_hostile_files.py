"""The reader treats a trace as untrusted input: hostile files fail fast, in bounded memory.

Each case must raise a clear :class:`TraceReadError` (or, for damage after
valid packets, read what came before and report a problem; strict mode then
raises), within a time and a peak of Python allocations measured here with
generous bounds (a slow CI machine must not fail them; a reader that
allocates what a file declares, or recurses, or inflates a bomb, does).

Files under ``fuzz_regressions/`` are inputs that once failed (too slow, or
read as a trace): each ``raises-*`` file must now raise TraceReadError and
each ``reads-*`` file read, within the bounds.
"""

from __future__ import annotations

import random
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from trace_helpers import trace_bytes

from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.errors import TraceReadError
from tracer.format import read_trace
from tracer.format._wire import varint

REGRESSIONS = Path(__file__).parent / "fuzz_regressions"
GIB = 1 << 30
MIB = 1 << 20


def _bounded(call: Callable[[], Any], seconds: float, mib: int) -> Any:
    """Run ``call``; fail if it takes over ``seconds`` or allocates over ``mib`` MiB at peak."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        return call()
    finally:
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert elapsed < seconds, f"took {elapsed:.1f} s (bound {seconds} s)"
        assert peak < mib * MIB, f"peak {peak / MIB:.0f} MiB (bound {mib} MiB)"


def _raises(data: bytes, match: str | None = None, seconds: float = 10, mib: int = 256) -> str:
    def call() -> str:
        with pytest.raises(TraceReadError, match=match) as info:
            read_trace(data)
        return str(info.value)

    message: str = _bounded(call, seconds, mib)
    assert len(message) < 600 and "\n" not in message, message  # one clear line
    return message


def _record(payload: bytes) -> bytes:
    return b"\x0a" + varint(len(payload)) + payload


def _valid_start() -> bytes:
    setup = pb.TracePacket(trusted_packet_sequence_id=1, sequence_flags=1)
    track = pb.TracePacket(trusted_packet_sequence_id=1)
    track.track_descriptor.uuid = 1
    track.track_descriptor.name = "t"
    event = pb.TracePacket(trusted_packet_sequence_id=1, timestamp=5)
    event.track_event.type = pb.TrackEvent.TYPE_INSTANT
    event.track_event.track_uuid = 1
    event.track_event.name = "before"
    return trace_bytes(setup, track, event)


# ------------------------------------------------------------------ random bytes

@pytest.mark.parametrize("first", [None, 0x0A], ids=["any-start", "record-tag-start"])
def test_random_bytes(first: int | None) -> None:
    rng = random.Random(20261202)
    data = bytearray(rng.randbytes(4 * MIB))
    if first is None:
        data[0] = 0x00 if data[0] == 0x0A else data[0]
    else:
        data[0] = first
    _raises(bytes(data), "not a Perfetto protobuf trace")


def test_random_records_after_a_valid_start_are_problems_not_crashes() -> None:
    rng = random.Random(7)
    data = _valid_start() + b"".join(
        _record(rng.randbytes(rng.randrange(1, 300))) for _ in range(2000)
    )
    model = _bounded(lambda: read_trace(data), 20, 256)
    assert [i.name for i in model.instants][:1] == ["before"]
    assert model.problems  # the random records are reported, not silently taken
    with pytest.raises(TraceReadError):
        read_trace(data, strict=True)


# ------------------------------------------------------- declared lengths of GBs

def test_first_record_declaring_gigabytes() -> None:
    data = b"\x0a" + varint(4 * GIB) + b"\x08\x01\x10\x02"
    message = _raises(data, "not a Perfetto protobuf trace")
    assert str(4 * GIB) in message


def test_record_declaring_gigabytes_after_valid_packets() -> None:
    data = _valid_start() + b"\x0a" + varint(4 * GIB) + b"\x50\x01" * 100
    model = _bounded(lambda: read_trace(data), 5, 64)
    assert [i.name for i in model.instants] == ["before"]  # what came before still reads
    assert not model.truncated  # not a file cut while written: damage
    assert [p.kind for p in model.problems] == ["bad_framing"]
    assert str(4 * GIB) in model.problems[0].message
    with pytest.raises(TraceReadError, match="bad_framing"):
        read_trace(data, strict=True)


def test_a_cut_record_is_still_a_cut() -> None:
    """A record cut short (declaring a plausible length) is a truncated trace, no error."""
    data = _valid_start() + b"\x0a" + varint(300) + b"\x50\x01" * 10
    model = read_trace(data)
    assert model.truncated and not model.problems


@pytest.mark.parametrize(
    "nested",
    [
        b"\x5a" + varint(4 * GIB) + b"\x48\x03",  # TracePacket.track_event
        # TrackEvent.debug_annotations[0].dict_entries[0] declaring 4 GiB
        b"\x5a\x0c\x48\x03\x22\x08\x52\x01k\x5a" + varint(4 * GIB),
        b"\x62" + varint(GIB) + b"\x12\x02\x08\x01",  # TracePacket.interned_data
    ],
    ids=["track_event", "debug_annotation", "interned_data"],
)
def test_nested_field_declaring_gigabytes(nested: bytes) -> None:
    packet = b"\x50\x01" + nested
    _raises(_record(packet), "does not decode")
    data = _valid_start() + _record(packet) + _valid_start()[:0]
    model = _bounded(lambda: read_trace(data), 5, 64)
    assert [p.kind for p in model.problems] == ["bad_packet"]
    assert [i.name for i in model.instants] == ["before"]


# ------------------------------------------------------------------ deep nesting

def _deep_annotation_packet(depth: int) -> bytes:
    """A TracePacket whose debug annotation nests ``depth`` dict_entries (built in O(depth))."""
    inner = b"\x52\x01k\x20\x01"  # name="k", int_value=1
    lengths = [len(inner)]
    for _ in range(depth):
        child = lengths[-1]
        lengths.append(4 + len(varint(child)) + child)
    # Outermost first: each level is name="k", then dict_entries holding the next.
    prefixes = [b"\x52\x01k\x5a" + varint(lengths[i - 1]) for i in range(depth, 0, -1)]
    annotation = b"".join(prefixes) + inner
    assert len(annotation) == lengths[-1]
    event = b"\x48\x03\x58\x01\xba\x01\x01x\x22" + varint(len(annotation)) + annotation
    return b"\x40\x05\x50\x01\x5a" + varint(len(event)) + event


def test_annotations_nested_100k_deep() -> None:
    packet = _deep_annotation_packet(100_000)
    assert len(packet) > 500_000
    _raises(_record(packet), "does not decode")
    data = _valid_start() + _record(packet)
    model = _bounded(lambda: read_trace(data), 10, 64)
    assert [p.kind for p in model.problems] == ["bad_packet"]
    assert [i.name for i in model.instants] == ["before"]


def test_nesting_protobuf_accepts_is_read_without_recursion_trouble() -> None:
    """Just under protobuf's limit (100): decoded, and the reader's own walk copes."""
    data = _valid_start() + _record(_deep_annotation_packet(90))
    model = _bounded(lambda: read_trace(data, strict=True), 5, 64)
    (_, deep) = model.instants
    value: Any = deep.args["k"]
    depth = 0
    while isinstance(value, dict):
        value = value["k"]
        depth += 1
    assert (depth, value) == (90, 1)


# -------------------------------------------------------------------- zlib bombs

def _zeros_bomb(total: int, chunk: int = MIB) -> bytes:
    """``total`` zero bytes, zlib-compressed by streaming a compressobj, never allocated.

    After a full flush the compressor starts afresh, so every chunk after the
    first compresses to the same bytes: 10 GiB of zeros is ~10 MB of deflate.
    """
    compressor = zlib.compressobj(9)
    head = compressor.compress(bytes(chunk)) + compressor.flush(zlib.Z_FULL_FLUSH)
    body = compressor.compress(bytes(chunk)) + compressor.flush(zlib.Z_FULL_FLUSH)
    again = compressor.compress(bytes(chunk)) + compressor.flush(zlib.Z_FULL_FLUSH)
    assert again == body
    return head + body * (total // chunk - 1) + compressor.flush()


def _bundle_record(payload: bytes) -> bytes:
    return _record(b"\x92\x03" + varint(len(payload)) + payload)


def test_ten_gib_of_zeros_in_a_bundle() -> None:
    bomb = _zeros_bomb(10 * GIB)
    assert len(bomb) < 12_000_000
    data = _valid_start() + _bundle_record(bomb)
    # Inflation stops at the bundle limit (64 MiB): the peak is that, not 10 GiB.
    _raises(data, "zlib bomb", seconds=20, mib=160)


def _empty_packets_bundle(mib: int) -> bytes:
    """A bundle of ``mib`` MiB of empty packets (``0a 00``): ~1000x smaller compressed."""
    compressor = zlib.compressobj(9)
    payload = b"".join(compressor.compress(b"\x0a\x00" * (MIB // 2)) for _ in range(mib))
    return _bundle_record(payload + compressor.flush())


def test_a_bundle_of_empty_packets_just_under_the_limit() -> None:
    """63 MiB of empty packets in a 64 KB bundle: once ~10 minutes of reading (10 µs a
    packet), now skipped at C speed; the peak is the inflated bundle."""
    data = _valid_start() + _empty_packets_bundle(63)
    assert len(data) < 70_000
    model = _bounded(lambda: read_trace(data), 5, 160)  # inflating peaks at ~2x the bundle
    assert model.packet_count == 3 + 63 * MIB // 2
    assert [i.name for i in model.instants] == ["before"] and not model.problems


def test_many_bundles_add_up_to_the_total_limit() -> None:
    """The total inflated size is capped too, not only each bundle."""
    data = _valid_start() + _empty_packets_bundle(1) * 40
    assert read_trace(data).packet_count == 3 + 40 * MIB // 2
    with pytest.raises(TraceReadError, match="max_inflated_size"):
        _bounded(lambda: read_trace(data, max_inflated_size=16 * MIB), 5, 64)


def test_regular_traces_compress_like_bombs(tmp_path: Path) -> None:
    """Why the reader has no limit on the compression ratio: a real trace of identical
    packets (a steady tick) compresses ~400x, close to zlib's ~1000x for a bomb."""
    from trace_helpers import FakeClock

    from tracer.format import TraceWriter

    path = tmp_path / "regular.perfetto-trace"
    n = 500_000
    with TraceWriter(path, clock=FakeClock(1000), compress=True) as writer:
        lane = writer.track("lane")
        for i in range(n):
            writer.instant(lane, "tick", 1000 + 10 * i)
    uncompressed = 9 * n  # each instant is a 9-byte record
    assert uncompressed / path.stat().st_size > 300
    model = read_trace(path)
    assert len(model.instants) == n and not model.problems


def test_bundles_inside_bundles() -> None:
    inner = _bundle_record(zlib.compress(_valid_start()))
    nested = inner
    for _ in range(50):  # a bundle in a bundle in a bundle ...
        nested = _bundle_record(zlib.compress(nested))
    data = _valid_start() + nested
    _raises(data, "inside a compressed bundle", seconds=5, mib=64)


# ------------------------------------------------------------ regression inputs

def _regressions() -> Iterator[Path]:
    return iter(sorted(REGRESSIONS.glob("*.bin")))


@pytest.mark.parametrize("path", list(_regressions()), ids=lambda p: p.name)
def test_fuzz_regressions(path: Path) -> None:
    data = path.read_bytes()
    if path.name.startswith("raises-"):
        _raises(data, seconds=10, mib=128)
    else:
        assert path.name.startswith("reads-"), path
        _bounded(lambda: read_trace(data), 10, 128)


def test_there_are_regression_inputs() -> None:
    names = [p.name for p in _regressions()]
    assert any(n.startswith("raises-") for n in names)
    assert any(n.startswith("reads-") for n in names)

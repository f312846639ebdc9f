"""The varint encoder against protobuf's own serializer (perfetto's compiled schema)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from tracer.format._wire import varint

#: Every width boundary of a varint (7 bits per byte) and of the encoder's tables (14 bits).
BOUNDARIES = sorted(
    {0, 1}
    | {v for bits in range(7, 64, 7) for v in ((1 << bits) - 1, 1 << bits, (1 << bits) + 1)}
    | {(1 << 64) - 1, (1 << 63) - 1, 1 << 63}
)


def _theirs_uint64(value: int) -> bytes:
    data = pb.TracePacket(timestamp=value).SerializeToString()
    assert data[0] == 0x40  # field 8, varint
    return data[1:]


def _theirs_int64(value: int) -> bytes:
    data = pb.DebugAnnotation(int_value=value).SerializeToString()
    assert data[0] == 0x20  # field 4, varint
    return data[1:]


def test_every_width_boundary_encodes_as_protobuf_does() -> None:
    for value in BOUNDARIES:
        assert varint(value) == _theirs_uint64(value), value


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_uint64_values_encode_as_protobuf_does(value: int) -> None:
    assert varint(value) == _theirs_uint64(value)


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_int64_values_encode_as_protobuf_does(value: int) -> None:
    # Negative int64 values are their two's complement: always ten bytes.
    assert varint(value) == _theirs_int64(value)

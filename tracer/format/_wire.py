"""Protobuf wire-format encoding, protozero-style.

The writer's hot path appends bytes built from these helpers instead of
building a message object per event (the way Perfetto's C++ SDK writes with
protozero). Only the few encodings tracer needs are here.
"""

from __future__ import annotations

import struct

# Varints of every value below 2**14 (the common timestamp deltas, lengths,
# uuids and iids), looked up instead of computed: 16384 small bytes objects.
VARINT_TABLE: list[bytes] = [bytes((i,)) for i in range(128)] + [
    bytes(((i & 0x7F) | 0x80, i >> 7)) for i in range(128, 1 << 14)
]
_TABLE_LIMIT = 1 << 14
_U64 = (1 << 64) - 1
_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")

# Values of the Perfetto schema that both the writer and the reader use.
TYPE_BEGIN = 1  # TrackEvent.Type
TYPE_END = 2
TYPE_INSTANT = 3
TYPE_COUNTER = 4
CLOCK_REALTIME = 1  # BuiltinClock
CLOCK_BOOTTIME = 6
CLOCK_INCREMENTAL = 64  # the first sequence-scoped clock id
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
#: CounterDescriptor.Unit and TrackDescriptor.ChildTracksOrdering, by tracer's names.
COUNTER_UNITS: dict[str, int] = {"ns": 1, "count": 2, "bytes": 3}
CHILD_ORDERING: dict[str, int] = {"lexicographic": 1, "chronological": 2, "explicit": 3}

WT_VARINT = 0
WT_FIXED64 = 1
WT_LEN = 2


#: The low 14 bits of a longer varint: two bytes, both with the continuation bit.
VARINT_CONT14: list[bytes] = [
    bytes(((i & 0x7F) | 0x80, (i >> 7) | 0x80)) for i in range(1 << 14)
]


def varint(value: int) -> bytes:
    """Encode a non-negative int (or a negative int64 as two's complement, 10 bytes).

    Fourteen bits at a time from tables: a timestamp (9 bytes) is five
    lookups, where a byte-at-a-time loop took four times as long, and late
    events, counters and args encode their timestamps and values here.
    """
    if 0 <= value < _TABLE_LIMIT:
        return VARINT_TABLE[value]
    if value < 0:
        value &= _U64
    if value < 1 << 28:
        return VARINT_CONT14[value & 0x3FFF] + VARINT_TABLE[value >> 14]
    out = VARINT_CONT14[value & 0x3FFF]
    value >>= 14
    while value >= _TABLE_LIMIT:
        out += VARINT_CONT14[value & 0x3FFF]
        value >>= 14
    return out + VARINT_TABLE[value]


def tag(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


def field_varint(field: int, value: int) -> bytes:
    return tag(field, WT_VARINT) + varint(value)


def field_bytes(field: int, payload: bytes) -> bytes:
    return tag(field, WT_LEN) + varint(len(payload)) + payload


def field_string(field: int, text: str) -> bytes:
    return field_bytes(field, text.encode("utf-8", "surrogatepass"))


def field_double(field: int, value: float) -> bytes:
    return tag(field, WT_FIXED64) + _DOUBLE.pack(value)


def field_fixed64(field: int, value: int) -> bytes:
    return tag(field, WT_FIXED64) + _FIXED64.pack(value & _U64)


def packet(payload: bytes) -> bytes:
    """Frame a TracePacket as ``Trace.packet`` (field 1), the file's record unit."""
    return b"\x0a" + varint(len(payload)) + payload

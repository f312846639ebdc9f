"""The bytes the writer is made of: framing, hot-path tables, limits, argument checks.

Shared by the writer's parts (:mod:`tracer.format.writer` and the modules
beside it) and mirrored by the C encoder (``_speedups.c``): a packet is built
protozero-style from pieces framed ahead, so that a cached event appends two
or three slices of prebuilt bytes and allocates nothing but its delta.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any, Literal

from tracer.errors import InvalidArgumentError, InvalidArgumentTypeError, TraceWriterClosedError
from tracer.format._wire import (
    CHILD_ORDERING,
    CLOCK_BOOTTIME,
    CLOCK_INCREMENTAL,
    CLOCK_REALTIME,
    COUNTER_UNITS,
    INT64_MAX,
    INT64_MIN,
    TYPE_BEGIN,
    TYPE_COUNTER,
    TYPE_END,
    TYPE_INSTANT,
    UINT64_MAX,
    VARINT_CONT14,
    VARINT_TABLE,
    field_fixed64,
    varint,
)

CounterUnit = Literal["count", "bytes", "ns"]
ChildOrdering = Literal["lexicographic", "chronological", "explicit"]

_COUNTER_UNITS = COUNTER_UNITS
_CHILD_ORDERING = CHILD_ORDERING

# TrackEvent.Type values.
_BEGIN = TYPE_BEGIN
_END = TYPE_END
_INSTANT = TYPE_INSTANT
_COUNTER = TYPE_COUNTER

_CLOCK_BOOTTIME = CLOCK_BOOTTIME
_CLOCK_REALTIME = CLOCK_REALTIME
_CLOCK_INCREMENTAL = CLOCK_INCREMENTAL
_ABSOLUTE_CLOCK = b"\xd0\x03\x06"  # TracePacket.timestamp_clock_id = BOOTTIME

_INT64_MIN = INT64_MIN
_INT64_MAX = INT64_MAX
_UINT64_MAX = UINT64_MAX

#: Interning stops adding entries past this many per table (bounded memory);
#: further new strings are written inline.
DEFAULT_INTERN_LIMIT = 65536
#: The per-(track, name) body caches stop growing past this many entries.
_BODY_CACHE_LIMIT = 200_000
#: String annotation values longer than this are never interned.
_MAX_INTERNED_VALUE_LEN = 256
#: The coarsest ``time_unit_ns``: one second.
_MAX_TIME_UNIT_NS = 1_000_000_000
#: Strings seen once are remembered in a set that is emptied at this size.
_SEEN_ONCE_LIMIT = 8192
#: Encoded (name, value) annotations kept for reuse; emptied when full.
_ARG_CACHE_LIMIT = 4096
_SCALARS = (str, int, float, bool)
#: Nested dicts and lists in annotations deeper than this are refused.
MAX_ARG_DEPTH = 32

# Hot-path tables and framing. A cached event is written as one packet:
# ``0A <length> <body> 40 <timestamp delta varint>`` (Trace.packet, then the
# TracePacket's fields with TracePacket.timestamp last), built from pieces
# framed ahead so that an event appends two or three slices and allocates
# nothing but the delta:
#
# * delta < 2**7 (1 varint byte):   frame1, VARINT_TABLE[delta]
# * delta < 2**14 (2 bytes):        frame2, VARINT_TABLE[delta]
# * delta < 2**21 (3 bytes, 2 ms):  frame3, VARINT_CONT14[delta & 0x3FFF], VARINT_TABLE[delta >> 14]
#
# where frameK is the packet head for a K-byte delta, the body and the
# timestamp tag. The timestamp goes last because it is the part of a packet
# that is never the same twice: after it, the next packet's head and body
# repeat earlier bytes, which zlib then matches in one run instead of two
# (``compress=True`` files are ~10% smaller; protobuf readers take fields in
# any order).
_VT = VARINT_TABLE
_DOUBLE = struct.Struct("<d")
_VARINT_CONT2 = VARINT_CONT14  # the low 14 bits of a longer varint
_TS_TAG = b"\x40"  # TracePacket.timestamp


#: ``(frame1, frame2, frame3, body)``, see above.
_Frames = tuple[bytes, bytes, bytes, bytes]


def _frames(body: bytes, extra: int = 0) -> _Frames:
    """The pieces of a packet ``body`` (+ ``extra`` bytes) + timestamp field.

    With ``extra`` (a counter's value, appended by the caller) the frames end
    at the body and the caller appends the value, then the timestamp tag.
    """
    n = len(body) + extra + 1  # the body, what follows and the timestamp tag
    tail = b"" if extra else _TS_TAG
    return (
        b"\x0a" + varint(n + 1) + body + tail,
        b"\x0a" + varint(n + 2) + body + tail,
        b"\x0a" + varint(n + 3) + body + tail,
        body,
    )


class _ClosedBuffer:
    """Stands in for the buffer after close, so the hot path needs no closed check."""

    def __iadd__(self, other: object) -> _ClosedBuffer:
        raise TraceWriterClosedError("the trace writer is closed; no more events can be written")

    __add__ = __iadd__

    def __len__(self) -> int:
        return 0


_MISSING = object()


class _NoLastValues(dict):  # type: ignore[type-arg]
    """Stands in for the counter dedupe memo after close: nothing equals a last
    value, so counter() always reaches the closed buffer (and raises)."""

    def get(self, key: object, default: object = None) -> object:
        return _MISSING

    def __setitem__(self, key: object, value: object) -> None:
        pass


def _len_prefixed(payload: bytes) -> bytes:
    return varint(len(payload)) + payload


def _timestamp_type_error(ts: object) -> InvalidArgumentTypeError:
    """What a timestamp that is not an int gets (a float from a clock, say).

    The hot path does not check types: it finds out when encoding the delta,
    before anything is buffered or the clock moves, and raises this instead.
    """
    return InvalidArgumentTypeError(
        f"a timestamp must be an int (in the writer's time unit), got "
        f"{type(ts).__name__} {ts!r}"
    )


def _check_name(name: object) -> None:
    if not isinstance(name, str):
        raise InvalidArgumentTypeError(f"a name must be a str, got {type(name).__name__}")


def _check_id(what: str, value: object, limit: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < limit:
        raise InvalidArgumentError(f"{what} must be a positive int below {limit}, got {value!r}")


def _check_rank(rank: object) -> None:
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < (1 << 31):
        raise InvalidArgumentError(f"rank must be an int in 0..2**31-1, got {rank!r}")


def _check_flow(flow: object) -> int:
    if not isinstance(flow, int) or isinstance(flow, bool) or not 0 < flow <= _UINT64_MAX:
        raise InvalidArgumentError(f"a flow id must be a positive 64-bit int, got {flow!r}")
    return flow


def _flow_fields(flows: Iterable[int] | None, terminating_flows: Iterable[int] | None) -> bytes:
    """TrackEvent.flow_ids (47) and terminating_flow_ids (48), each id checked."""
    out = b""
    for flow in flows or ():
        out += field_fixed64(47, _check_flow(flow))
    for flow in terminating_flows or ():
        out += field_fixed64(48, _check_flow(flow))
    return out


#: trace_processor reads at most this many extra_counter_values per event.
_MAX_EXTRA_COUNTERS = 8


def _varint_value(data: bytes, pos: int) -> int:
    """The varint at ``data[pos:]``."""
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value
        pos += 1
        shift += 7


def _arg_cache_key(key: object, value: object) -> tuple[Any, ...] | None:
    """A hashable key for an annotation worth caching (scalars, flat dicts), else None."""
    cls = value.__class__
    if cls in _SCALARS:
        if cls is float and not value:
            return None  # 0.0 == -0.0, yet they encode differently
        return (key, cls, value)
    if cls is dict and len(value) <= 8:  # type: ignore[arg-type]
        items = tuple(value.items())  # type: ignore[attr-defined]
        if all(
            k.__class__ is str and v.__class__ in _SCALARS and (v.__class__ is not float or v)
            for k, v in items
        ):
            return (key, dict, tuple((k, v.__class__, v) for k, v in items))
    return None

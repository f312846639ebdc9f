"""Helpers shared by the format tests (imported as a plain module: pytest puts
this folder on ``sys.path``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.format import TraceModel


class FakeClock:
    """A writer clock the test controls: returns ``now`` and advances it by ``step``."""

    def __init__(self, start: int = 1_000_000_000, step: int = 0) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> int:
        value = self.now
        self.now += self.step
        return value


def records(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(offset, payload) of each complete ``Trace.packet`` record of ``data``."""
    pos = 0
    while pos < len(data):
        assert data[pos] == 0x0A, f"no record tag at offset {pos}"
        q = pos + 1
        length = shift = 0
        while True:
            if q >= len(data):
                return
            byte = data[q]
            q += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        if q + length > len(data):
            return
        yield pos, data[q : q + length]
        pos = q + length


def record_ends(data: bytes) -> list[int]:
    """The offset just after each complete record."""
    ends = []
    for offset, payload in records(data):
        header = 1 + len(varint(len(payload)))
        ends.append(offset + header + len(payload))
    return ends


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def trace_bytes(*packets: pb.TracePacket) -> bytes:
    """A trace file made of these packets (our pb2's ``Trace`` framing)."""
    return pb.Trace(packet=list(packets)).SerializeToString()


def content(model: TraceModel) -> dict[str, Any]:
    """What a model shows (everything but problems and file-position details)."""
    return {
        "tracks": model.tracks,
        "slices": model.slices,
        "instants": model.instants,
        "counters": model.counters,
        "flows": model.flows,
        "process_ordering": model.process_ordering,
        "thread_ordering": model.thread_ordering,
    }

"""Byte-level helpers for tests that damage traces."""

from __future__ import annotations

import zlib


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``data[pos:]`` and the offset after it."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _records(data: bytes) -> list[bytes]:
    """The TracePacket payloads of ``Trace.packet`` records (``0a <len> <packet>``)."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        assert data[pos] == 0x0A, f"not a packet record at {pos}"
        length, start = read_varint(data, pos + 1)
        out.append(data[start : start + length])
        pos = start + length
    return out


def record_starts(data: bytes) -> list[int]:
    """The offset of every ``Trace.packet`` record of ``data``."""
    starts: list[int] = []
    pos = 0
    while pos < len(data):
        starts.append(pos)
        length, start = read_varint(data, pos + 1)
        pos = start + length
    return starts


def cut_inside_a_record(data: bytes, fraction: float) -> bytes:
    """``data`` cut about ``fraction`` of the way, always inside a record: a cut
    right on a record boundary would leave a complete, untruncated trace."""
    cut = int(len(data) * fraction)
    start = max(p for p in record_starts(data) if p <= cut)
    return data[: max(cut, start + 3)]


def _record(packet: bytes) -> bytes:
    length, out = len(packet), bytearray(b"\x0a")
    while True:
        out.append((length & 0x7F) | (0x80 if length > 0x7F else 0))
        length >>= 7
        if not length:
            return bytes(out) + packet


def uncompressed(data: bytes) -> bytes:
    """The same trace with every ``compressed_packets`` bundle inflated into plain records."""
    out = bytearray()
    for packet in _records(data):
        if packet[:2] == b"\x92\x03":  # a packet holding only compressed_packets (field 50)
            length, start = read_varint(packet, 2)
            assert start + length == len(packet), "a bundle packet with other fields"
            out += zlib.decompress(packet[start : start + length])
        else:
            out += _record(packet)
    return bytes(out)

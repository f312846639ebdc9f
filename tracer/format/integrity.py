"""Is a trace file whole? Its framing only, for tools that hand the file to another reader.

trace_processor reads a trace cut while being written without a word: a
compressed trace cut inside its bundle reads as an empty trace, and every
answer then says "nothing there" as if that were the run. Our readers tell a
cut (``truncated``) from damage; :func:`check_framing` tells the same
without decoding anything: it walks the ``0A <length>`` records (skipping
their payloads), so it costs a read of the file's record headers, not a parse.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, NamedTuple

from tracer.errors import TraceReadError
from tracer.format._framing import _scan_varint, _sniff
from tracer.format._gunzip import GZIP_MAGIC, Gunzip

__all__ = ["Framing", "check_framing"]

_CHUNK = 1 << 20


class Framing(NamedTuple):
    """What the records of a trace file say about it."""

    #: Complete top-level records (packets and compressed bundles; empty ones count).
    records: int
    #: Bytes of the trace (inflated, for a gzip file).
    size: int
    #: Where the last complete record ends: everything a reader can use is before it.
    complete: int
    #: The file ends inside a record: it was cut while being written (or copied).
    truncated: bool
    #: Where something that is no record starts (damage); None when the framing is sound.
    damaged_at: int | None
    #: The file is gzip-compressed (offsets are in the inflated trace).
    gzip: bool

    @property
    def whole(self) -> bool:
        return not self.truncated and self.damaged_at is None


def check_framing(path: str | os.PathLike[str]) -> Framing:
    """Walk the records of the trace at ``path`` (plain or gzip-compressed).

    Raises :class:`~tracer.errors.TraceReadError` when the file is missing,
    unreadable, empty or not a Perfetto protobuf trace at all (what it looks
    like instead, e.g. JSON, is in the message).
    """
    path = Path(path)
    what = f"trace file {path}"
    try:
        f = path.open("rb")
    except OSError as exc:
        raise TraceReadError(f"cannot read {what}: {exc.strerror or exc}") from exc
    try:
        with f:
            if f.peek(2)[:2] == GZIP_MAGIC:
                stream = Gunzip(f, what)
                try:
                    framing = _walk(stream, what, gzip=True)  # type: ignore[arg-type]
                except TraceReadError:
                    if not stream.cut_before_anything:
                        raise
                    return Framing(0, 0, 0, True, None, True)
                if stream.cut and not framing.truncated:
                    framing = framing._replace(truncated=True)
                return framing
            return _walk(f, what, gzip=False)
    except OSError as exc:  # a read error after the open (EIO, a folder...)
        raise TraceReadError(f"cannot read {what}: {exc.strerror or exc}") from exc


def _walk(f: BinaryIO, what: str, *, gzip: bool) -> Framing:
    data = f.read(_CHUNK)
    if not data:
        raise TraceReadError(f"{what}: empty file (0 bytes), not a Perfetto trace")
    if data[0] != 0x0A:
        raise TraceReadError(f"{what}: not a Perfetto protobuf trace ({_sniff(data)})")
    base = 0  # offset of data[0] in the trace
    pos = 0
    records = 0
    eof = len(data) < _CHUNK
    while True:
        end = len(data)
        if end - pos < 11 and not eof:  # room for a tag and a 10-byte varint
            more = f.read(_CHUNK)
            eof = len(more) < _CHUNK
            data = data[pos:] + more
            base += pos
            pos = 0
            continue
        if pos >= end:
            return Framing(records, base + pos, base + pos, False, None, gzip)
        if data[pos] != 0x0A:
            return Framing(records, _size(f, base + end, eof), base + pos, False, base + pos, gzip)
        length, q = _scan_varint(data, pos + 1)
        if length is None:
            if q < 0:  # a length of more than 10 bytes: damage
                return Framing(records, _size(f, base + end, eof), base + pos, False, base + pos,
                               gzip)
            return Framing(records, base + end, base + pos, True, None, gzip)  # cut in a header
        stop = q + length
        if stop <= end:
            pos = stop
            records += 1
            continue
        # The record goes past what is read: skip its payload without keeping it.
        missing = stop - end
        skipped = _skip(f, missing)
        if skipped < missing:
            return Framing(records, base + end + skipped, base + pos, True, None, gzip)
        base += stop
        records += 1
        data = f.read(_CHUNK)
        eof = len(data) < _CHUNK
        pos = 0


def _skip(f: BinaryIO, n: int) -> int:
    """Skip ``n`` bytes of ``f``; returns how many there were."""
    seekable = getattr(f, "seekable", None)
    if seekable is not None and seekable():
        here = f.tell()
        size = f.seek(0, os.SEEK_END)
        target = min(here + n, size)
        f.seek(target)
        return target - here
    done = 0
    while done < n:
        piece = f.read(min(_CHUNK, n - done))
        if not piece:
            break
        done += len(piece)
    return done


def _size(f: BinaryIO, read_so_far: int, eof: bool) -> int:
    """The trace's size, reading no more of it than needed (a plain file: its length)."""
    if eof:
        return read_so_far
    seekable = getattr(f, "seekable", None)
    if seekable is not None and seekable():
        return int(f.seek(0, os.SEEK_END))
    return read_so_far + _skip(f, 1 << 62)

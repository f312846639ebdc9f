"""A gzip-compressed trace read as the trace it holds (trace_processor opens them too).

The readers take a file object and call ``read(n)``; :class:`Gunzip` is one
that inflates as it goes, at most what was asked for at a time (a small file
that inflates to gigabytes is read in bounded memory, like any big trace),
and remembers whether the compressed stream ended early: a ``.gz`` cut while
being copied is a truncated trace, not an error.
"""

from __future__ import annotations

import zlib
from typing import BinaryIO

from tracer.errors import TraceReadError

__all__ = ["GZIP_MAGIC", "Gunzip"]

GZIP_MAGIC = b"\x1f\x8b"
_RAW_CHUNK = 1 << 20


class Gunzip:
    """``read(n)`` of the inflated content of a gzip file (one member or several)."""

    def __init__(self, raw: BinaryIO, what: str) -> None:
        self._raw = raw
        self._what = what
        self._inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        self._pending = b""  # compressed bytes not yet handed to the inflater
        self._done = False
        #: The compressed stream ended inside a member (the file was cut).
        self.cut = False
        #: Bytes inflated so far.
        self.inflated = 0

    def read(self, n: int) -> bytes:
        out: list[bytes] = []
        have = 0
        while have < n and not self._done:
            piece = self._inflate(n - have)
            if piece:
                out.append(piece)
                have += len(piece)
        self.inflated += have
        return b"".join(out)

    @property
    def cut_before_anything(self) -> bool:
        """Cut before a single byte of the trace: a truncated trace, not an empty file."""
        return self.cut and self.inflated == 0

    def _inflate(self, want: int) -> bytes:
        inflater = self._inflater
        if inflater.eof:
            rest = inflater.unused_data + self._pending
            self._pending = b""
            if not rest:
                rest = self._raw.read(_RAW_CHUNK)
            if not rest.startswith(GZIP_MAGIC[:len(rest)]) or not rest:
                self._done = True  # the end, or padding after the last member: as gzip does
                return b""
            inflater = self._inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            self._pending = rest
        data = inflater.unconsumed_tail or self._pending
        self._pending = b""
        if not data:
            data = self._raw.read(_RAW_CHUNK)
            if not data:
                self.cut = True
                self._done = True
                return b""
        try:
            return inflater.decompress(data, want)
        except zlib.error as exc:
            raise TraceReadError(f"{self._what}: its gzip compression is damaged ({exc})") from exc

"""Framing of a Perfetto protobuf trace: records, compressed bundles, cuts, problems.

The first stage of both readers (:func:`tracer.format.read_trace` and
:func:`tracer.format.scan_trace`). A file is a run of
``0A <varint length> <TracePacket>`` records; this module finds them, in
chunks of the file (so a reader never holds the whole file), inflates
``compressed_packets`` bundles under hard caps, tells a file cut while being
written (``truncated``) from damage (``bad_framing``), and hands each record
to :meth:`_Framer.record` (decode and tokenize), or, for a record whose bytes
apart from its timestamp were seen before, its cached decoding to
:meth:`_Framer.replay`. Both are implemented by the tokenizer
(:mod:`tracer.format._tokenizer`).

The input is treated as untrusted: every declared length is checked against
the bytes that are left before anything is sliced, and inflation is bounded
per bundle and in all.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, BinaryIO

from tracer.errors import TraceReadError
from tracer.format._wire import UINT64_MAX
from tracer.format.model import MAX_PROBLEMS_PER_KIND, Problem, ProblemKind

__all__ = ["CHUNK_SIZE", "Where"]

#: Where a packet is: (packet index, file offset, offset inside its inflated bundle).
Where = tuple[int, int, int | None]

#: How much of the file is read at a time (more when one record is bigger).
CHUNK_SIZE = 4 << 20

#: Blocks of empty records (``0a 00``, no-ops), largest first: a run of them is
#: skipped in a few comparisons.
_EMPTY_BLOCKS = [b"\x0a\x00" * (1 << k) for k in range(11, -1, -1)]
_UINT64_MASK = UINT64_MAX


class _Framer:
    """Reads records from the file (or its bytes) and the bundles they hold.

    Subclasses implement :meth:`record` and :meth:`replay`, and may
    implement :meth:`drain`, which is called after each chunk of the file
    and each bundle (a point where the events tokenized so far may be
    consumed).
    """

    #: ``fast_forward(reader, data, pos, file_offset, in_bundle) -> pos``: reads what
    #: records it can from ``pos`` on (the C fast path of replays, when built),
    #: returning where the Python loop takes over; None: no fast path.
    fast_forward: Callable[[Any, bytes, int, int, bool], int] | None = None

    def __init__(self, what: str, strict: bool, max_bundle_size: int, max_inflated: int) -> None:
        self.what = what
        self.strict = strict
        self.max_bundle_size = max_bundle_size
        self.max_inflated = max_inflated
        self.inflated_bytes = 0  # by the bundles so far
        self.problems: list[Problem] = []
        self.problem_counts: dict[str, int] = {}
        self.problem_total = 0
        self.truncated = False
        self.templates: dict[bytes, Any] = {}
        self.packet_index = 0
        # Where the packet being read is: (packet index, file offset, bundle offset).
        self.where: Where = (0, 0, None)
        # How many bytes the record at the end of the current chunk needs, from its start.
        self.need = 0

    # ------------------------------------------------------------ problems

    def problem(self, kind: ProblemKind, message: str, where: Where | None = None) -> None:
        index, offset, inner = self.where if where is None else where
        found = Problem(kind, message, index, offset, inner)
        self.problem_total += 1
        if self.strict:
            raise TraceReadError(f"{self.what}: {found}")
        counts = self.problem_counts
        seen = counts.get(kind, 0)
        counts[kind] = seen + 1
        if seen < MAX_PROBLEMS_PER_KIND:
            self.problems.append(found)

    # ------------------------------------------------------------- hooks

    def record(self, record: bytes, first: bool, key: bytes | None, raw: int) -> None:
        raise NotImplementedError

    def replay(self, template: Any, raw: int) -> None:
        """Tokenize a packet from ``template``, its cached decoding (an object whose
        ``generation`` must equal its ``seq.generation`` to be used), and its timestamp."""
        raise NotImplementedError

    def drain(self) -> None:
        """Called after each chunk of the file and each bundle."""

    # ------------------------------------------------------------- sources

    def read_bytes(self, data: bytes) -> None:
        """Read a whole trace held in memory."""
        self.check_start(data)
        self.read_records(data, 0, None, True)
        self.drain()

    def read_file(self, f: BinaryIO, chunk_size: int | None = None) -> None:
        """Read a trace file chunk by chunk; a record is read whole however big it is."""
        chunk_size = chunk_size or CHUNK_SIZE
        data = f.read(chunk_size)
        self.check_start(data)
        base = 0
        final = len(data) < chunk_size
        while True:
            stopped = self.read_records(data, base, None, final)
            self.drain()
            if stopped < 0 or final:
                return
            # Carry the incomplete record over, and read at least what it declared.
            tail = data[stopped:]
            base += stopped
            want = max(chunk_size, self.need - len(tail))
            more = f.read(want)
            final = len(more) < want
            data = tail + more if tail else more
            self.need = 0

    def check_start(self, data: bytes) -> None:
        if not data:
            raise TraceReadError(f"{self.what}: empty file (0 bytes), not a Perfetto trace")
        if data[0] != 0x0A:
            raise TraceReadError(f"{self.what}: not a Perfetto protobuf trace ({_sniff(data)})")

    # ------------------------------------------------------------- records

    def read_records(
        self, data: bytes, file_offset: int, bundle_offset: int | None, final: bool
    ) -> int:
        """Read the ``Trace.packet`` records of a chunk of the file, or of an inflated bundle.

        ``bundle_offset`` is None for the file itself, whose chunk ``data``
        starts at ``file_offset``; inside a bundle, ``file_offset`` is the
        bundle record's offset in the file. Returns where an incomplete
        record starts in a chunk that is not the file's last (``final``
        false: read on from there, with at least ``self.need`` bytes), else
        ``len(data)``, or -1 when reading must stop (damage).
        """
        in_bundle = bundle_offset is not None
        end = len(data)
        pos = 0
        fast = self.fast_forward
        while pos < end:
            if fast is not None:
                pos = fast(self, data, pos, file_offset, in_bundle)
                if pos >= end:
                    break
            if data[pos] != 0x0A:
                if not in_bundle and file_offset + pos == 0:
                    raise TraceReadError(
                        f"{self.what}: not a Perfetto protobuf trace ({_sniff(data)})"
                    )
                message = f"byte 0x{data[pos]:02x} where a TracePacket record (0x0a) should start"
                if in_bundle:
                    self.problem("bad_bundle", message, (self.packet_index, file_offset, pos))
                else:
                    self.problem(
                        "bad_framing",
                        message + "; the rest is not read",
                        (self.packet_index, file_offset + pos, None),
                    )
                return -1
            if data[pos + 1 : pos + 2] == b"\x00":  # empty records: no-ops
                start = pos
                for block in _EMPTY_BLOCKS:
                    while data.startswith(block, pos):
                        pos += len(block)
                self.packet_index += (pos - start) // 2
                continue
            q = pos + 1
            length = 0
            shift = 0
            while True:
                if q >= end:
                    if not final:
                        self.need = 0
                        return pos
                    return self.cut(data, pos, None, file_offset, bundle_offset)
                byte = data[q]
                q += 1
                length |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
                if shift >= 70:
                    message = "a record length varint longer than 10 bytes"
                    if in_bundle:
                        self.problem("bad_bundle", message, (self.packet_index, file_offset, pos))
                    elif file_offset + pos == 0:
                        raise TraceReadError(
                            f"{self.what}: not a Perfetto protobuf trace ({message})"
                        )
                    else:
                        self.problem(
                            "bad_framing", message, (self.packet_index, file_offset + pos, None)
                        )
                    return -1
            if length > end - q:
                if not final:
                    self.need = q - pos + length
                    return pos
                if length > self.max_bundle_size and not in_bundle:
                    if file_offset + pos == 0:
                        raise TraceReadError(
                            f"{self.what}: not a Perfetto protobuf trace (its first record "
                            f"declares {length} bytes, more than the file holds)"
                        )
                    self.problem(
                        "bad_framing",
                        f"a record that declares {length} bytes, more than the file holds and "
                        f"more than max_bundle_size: damage, not a cut; the rest is not read",
                        (self.packet_index, file_offset + pos, None),
                    )
                    return -1
                return self.cut(data, pos, q, file_offset, bundle_offset)
            start = pos
            stop = pos = q + length
            if in_bundle:
                self.where = (self.packet_index, file_offset, start)
            else:
                self.where = (self.packet_index, file_offset + start, None)
            # The fast path: a packet whose bytes apart from its timestamp
            # field were seen before (see _Template). The writer puts the
            # timestamp last; traces from before it did put it first.
            key = None
            raw = 0
            if length > 2 and data[q] == 0x40:
                j = q + 1
                shift = 0
                while j < stop and shift < 64:
                    byte = data[j]
                    j += 1
                    raw |= (byte & 0x7F) << shift
                    if byte < 0x80:
                        key = data[j:stop]
                        break
                    shift += 7
            elif length > 3 and (last := data[stop - 1]) < 0x80:
                # Back over the varint's continuation bytes to its tag (1-3
                # bytes, a gap under 2 ms, unrolled: this runs for every packet).
                byte = data[stop - 2]
                if byte == 0x40:
                    raw = last
                    key = data[q : stop - 2]
                elif byte >= 0x80:
                    raw = (last << 7) | (byte & 0x7F)
                    j = stop - 3
                    while j > q and data[j] >= 0x80 and stop - j <= 10:
                        raw = (raw << 7) | (data[j] & 0x7F)
                        j -= 1
                    if data[j] == 0x40:
                        key = data[q:j]
            if key is not None:
                template = self.templates.get(key)
                if template is not None and template.generation == template.seq.generation:
                    self.packet_index += 1
                    self.replay(template, raw & _UINT64_MASK)  # as protobuf truncates it
                    continue
            self.record(data[q:stop], file_offset + start == 0 and not in_bundle, key, raw)
        return end

    def cut(
        self,
        data: bytes,
        pos: int,
        body: int | None,
        file_offset: int,
        bundle_offset: int | None,
    ) -> int:
        """The data ends inside the record at ``pos`` (its payload starts at ``body``);
        returns -1 (nothing more to read)."""
        if bundle_offset is not None:
            self.problem(
                "bad_bundle",
                f"the inflated bundle ends inside a packet ({len(data) - pos} bytes left over)",
                (self.packet_index, file_offset, pos),
            )
            return -1
        if file_offset + pos == 0 and body is not None and not _plausible_prefix(data, body):
            raise TraceReadError(
                f"{self.what}: not a Perfetto protobuf trace (its first record is "
                "neither complete nor the start of a TracePacket)"
            )
        self.truncated = True
        return -1

    def bundle(self, payload: bytes, offset: int) -> None:
        # 32 + MAX_WBITS: a zlib or gzip header, as trace_processor accepts.
        inflater = zlib.decompressobj(wbits=32 + 15)
        limit = min(self.max_bundle_size, self.max_inflated - self.inflated_bytes)
        try:
            inflated = inflater.decompress(payload, limit + 1)
        except zlib.error as exc:
            self.problem(
                "bad_bundle",
                f"a compressed bundle that does not inflate: {exc}",
                (self.packet_index, offset, None),
            )
            return
        if len(inflated) > limit:
            if limit == self.max_bundle_size:
                raise TraceReadError(
                    f"{self.what}: the compressed bundle at offset {offset} inflates to more "
                    f"than {limit} bytes (the limit is max_bundle_size); refusing a possible "
                    "zlib bomb"
                )
            raise TraceReadError(
                f"{self.what}: the compressed bundles up to offset {offset} inflate to more "
                f"than {self.max_inflated} bytes in all (the limit is max_inflated_size); "
                "refusing a possible zlib bomb"
            )
        self.inflated_bytes += len(inflated)
        if not inflater.eof:
            self.problem(
                "bad_bundle",
                "a compressed bundle whose zlib stream is incomplete",
                (self.packet_index, offset, None),
            )
            return
        self.read_records(inflated, offset, 0, True)
        self.drain()


def _plausible_prefix(data: bytes, pos: int) -> bool:
    """Whether ``data[pos:]`` can be the start of a serialized TracePacket cut short."""
    end = len(data)
    fields = 0
    while pos < end:
        tag, pos = _scan_varint(data, pos)
        if tag is None:
            return pos >= end
        field, wire_type = tag >> 3, tag & 7
        if field == 0 or wire_type not in (0, 1, 2, 5):
            return False
        fields += 1
        if wire_type == 0:
            value, pos = _scan_varint(data, pos)
            if value is None:
                return pos >= end
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            length, pos = _scan_varint(data, pos)
            if length is None:
                return pos >= end
            pos += length
    return True


def _scan_varint(data: bytes, pos: int) -> tuple[int | None, int]:
    """(value, next position); value None if cut (position = end) or over 10 bytes."""
    value = 0
    shift = 0
    end = len(data)
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            return None, -1
    return None, end


def _sniff(data: bytes) -> str:
    """Why ``data`` does not look like a trace, for an error message."""
    head = data[:2]
    if head == b"\x1f\x8b":
        return "it is gzip-compressed: gunzip it first"
    if data[:4] == b"\x28\xb5\x2f\xfd":
        return "it is zstd-compressed: decompress it first"
    stripped = data.lstrip()[:1]
    if stripped in (b"{", b"["):
        return "it looks like JSON (a Chrome JSON trace?), not protobuf"
    sample = data[:64]
    if all(32 <= b < 127 or b in (9, 10, 13) for b in sample):
        return f"it looks like text: {sample[:32].decode('ascii', 'replace')!r}"
    return f"it starts with bytes {data[:8].hex(' ')}, not a TracePacket record (0a)"

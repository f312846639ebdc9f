"""``check_framing``: whether a trace file is whole, from its records alone; and gzip traces.

For tools that hand the file to another reader: trace_processor reads a cut
trace without a word. Every cut must be found, every whole file called whole,
and a gzip-compressed trace read as the trace it holds (as trace_processor does).
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import pytest
from test_truncation import write_small_trace
from trace_helpers import content, record_ends

from tracer.errors import TraceReadError
from tracer.format import TraceVisitor, check_framing, read_trace, scan_trace
from tracer.format.integrity import _walk

pytestmark = pytest.mark.unchecked_traces("cut and damaged traces on purpose")


@pytest.fixture(params=[False, True], ids=["raw", "compressed"])
def whole(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / "whole.perfetto-trace"
    write_small_trace(path, compress=request.param)
    return path


def test_a_whole_trace_is_whole(whole: Path) -> None:
    data = whole.read_bytes()
    framing = check_framing(whole)
    assert framing.whole and not framing.truncated and framing.damaged_at is None
    assert framing.size == framing.complete == len(data)
    assert framing.records == len(record_ends(data))
    assert not framing.gzip


def test_every_cut_is_found(whole: Path, tmp_path: Path) -> None:
    data = whole.read_bytes()
    ends = record_ends(data)
    cut = tmp_path / "cut.perfetto-trace"
    for n in range(1, len(data)):
        cut.write_bytes(data[:n])
        framing = check_framing(cut)
        complete = [e for e in ends if e <= n]
        assert framing.records == len(complete), n
        assert framing.complete == (complete[-1] if complete else 0), n
        # A cut on a record's end leaves a whole (shorter) trace: nothing can tell.
        assert framing.truncated == (n not in ends), n
        assert framing.damaged_at is None
        assert framing.truncated == read_trace(cut).truncated, n  # as the reader says


def test_damage_is_not_a_cut(whole: Path, tmp_path: Path) -> None:
    data = whole.read_bytes()
    ends = record_ends(data)
    bad = tmp_path / "bad.perfetto-trace"
    bad.write_bytes(data[: ends[0]] + b"\x12\x34" + data[ends[0]:])
    framing = check_framing(bad)
    assert framing.damaged_at == ends[0] and not framing.truncated and not framing.whole
    assert framing.records == 1 and framing.size == len(data) + 2
    bad.write_bytes(data[: ends[0]] + b"\x0a" + b"\xff" * 11)  # a length of 11 bytes
    framing = check_framing(bad)
    assert framing.damaged_at == ends[0] and not framing.truncated
    bad.write_bytes(data[: ends[0]] + b"\x0a\xff\xff")  # a length cut short: a cut
    framing = check_framing(bad)
    assert framing.truncated and framing.damaged_at is None and framing.complete == ends[0]


def test_big_records_are_skipped_not_read(tmp_path: Path) -> None:
    """Records longer than a chunk (a bundle of megabytes) are skipped over, however read."""
    payload = b"\x08\x01" * (3 << 19)  # 3 MiB: more than a chunk
    record = b"\x0a" + _varint(len(payload)) + payload
    path = tmp_path / "big.perfetto-trace"
    path.write_bytes(record * 3)
    framing = check_framing(path)
    assert framing.whole and framing.records == 3 and framing.size == 3 * len(record)
    path.write_bytes(record * 2 + record[: len(record) // 2])
    framing = check_framing(path)
    assert framing.truncated and framing.records == 2 and framing.complete == 2 * len(record)
    # The same through a stream that cannot seek (a gzip file's, a pipe's).
    unseekable = _walk(_NoSeek(record * 2 + record[:100]), "t", gzip=False)
    assert unseekable.truncated and unseekable.records == 2


def test_not_a_trace_says_what_it_looks_like(tmp_path: Path) -> None:
    cases = {
        "empty.perfetto-trace": (b"", "empty file"),
        "chrome.perfetto-trace": (b'[{"ph": "X"}]', "looks like JSON"),
        "notes.perfetto-trace": (b"hello", "looks like text"),
    }
    for name, (data, needle) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(TraceReadError, match=needle):
            check_framing(path)
    with pytest.raises(TraceReadError, match="cannot read"):
        check_framing(tmp_path / "missing.perfetto-trace")


def test_a_gzipped_trace_reads_as_the_trace_it_holds(whole: Path, tmp_path: Path) -> None:
    data = whole.read_bytes()
    packed = tmp_path / "whole.perfetto-trace.gz"
    packed.write_bytes(gzip.compress(data))
    assert content(read_trace(packed)) == content(read_trace(whole))
    assert scan_trace(packed, TraceVisitor()).packet_count == scan_trace(
        whole, TraceVisitor()).packet_count
    framing = check_framing(packed)
    assert framing.whole and framing.gzip and framing.size == len(data)
    # Two members (gzip files concatenated) are one stream, as gunzip reads them.
    ends = record_ends(data)
    two = tmp_path / "two.perfetto-trace.gz"
    two.write_bytes(gzip.compress(data[: ends[0]]) + gzip.compress(data[ends[0]:]))
    assert content(read_trace(two)) == content(read_trace(whole))


def test_a_gzipped_trace_cut_short_is_truncated(whole: Path, tmp_path: Path) -> None:
    packed = gzip.compress(whole.read_bytes())
    cut = tmp_path / "cut.perfetto-trace.gz"
    for n in (20, len(packed) // 2, len(packed) - 4):  # inside the data; in the trailer
        cut.write_bytes(packed[:n])
        assert read_trace(cut).truncated, n
        assert check_framing(cut).truncated, n


def test_damaged_gzip_is_an_error(whole: Path, tmp_path: Path) -> None:
    packed = bytearray(gzip.compress(whole.read_bytes()))
    packed[20:30] = b"\xff" * 10
    bad = tmp_path / "bad.perfetto-trace.gz"
    bad.write_bytes(bytes(packed))
    with pytest.raises(TraceReadError, match="gzip compression is damaged"):
        read_trace(bad)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


class _NoSeek(io.RawIOBase):
    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self._data.read(n)

    def seekable(self) -> bool:
        return False

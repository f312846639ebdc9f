"""The live capture reader (tracer.ray._memray_reader) against memray's own FileReader.

memray is the judge: a real tracker writes a real capture in this process,
the reader follows it, and every record and figure must be what memray's
public FileReader reads from the same file once the tracker has stopped.
"""

from __future__ import annotations

import mmap
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import memray
import pytest

from tracer.ray import _memray_reader as R

MIB = 1 << 20
#: Other threads of this process allocate meanwhile (Ray's, when a test before
#: started Ray here): memray counts every thread, as in test_memory_ray.
SLACK = MIB


@pytest.fixture
def capture(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A tracker writing an ALL_ALLOCATIONS capture, and the file opened for the reader."""
    state: dict[str, Any] = {"path": tmp_path / "capture.bin", "trackers": []}

    def start(native_traces: bool = False) -> int:
        path = state["path"]
        tracker = memray.Tracker(
            destination=memray.FileDestination(path, overwrite=True, compress_on_exit=False),
            native_traces=native_traces,
            file_format=memray.FileFormat.ALL_ALLOCATIONS,
        )
        fd = os.open(path, os.O_RDWR)
        state["trackers"].append(tracker)
        state["fd"] = fd
        tracker.__enter__()
        return fd

    def stop() -> None:
        state["trackers"].pop().__exit__(None, None, None)

    state["start"], state["stop"] = start, stop
    yield state
    if state["trackers"]:  # a test that failed before stopping its tracker
        stop()
    if "fd" in state:
        os.close(state["fd"])


def _workload(keep: list[Any]) -> None:
    """Allocations of every kind a Python task makes: malloc, calloc, realloc, frees,
    mmap/munmap (an mmap object; pymalloc's arenas), from two threads, held across
    memray's 10 ms snapshots."""

    def other_thread() -> None:
        for i in range(2000):
            keep.append(bytearray(700 + i))

    thread = threading.Thread(target=other_thread)
    thread.start()
    grown = bytearray(1000)
    for i in range(3000):
        block = bytearray(1000 + i % 50)
        if i % 3:
            keep.append(block)
        grown += b"x" * 600  # realloc
    keep.append(grown)
    big = bytes(20 * MIB)  # calloc
    mapped = mmap.mmap(-1, 8 * MIB)
    mapped[:: mmap.PAGESIZE] = b"x" * (8 * MIB // mmap.PAGESIZE)
    small = [object() for _ in range(200_000)]  # pymalloc arenas: mmap, then munmap
    time.sleep(0.05)
    del small
    mapped.close()
    del big
    thread.join()


def _memray_figures(path: Path) -> dict[str, Any]:
    with memray.FileReader(path) as reader:
        records = [
            (r.tid, r.address, r.size, int(r.allocator)) for r in reader.get_allocation_records()
        ]
        return {
            "records": records,
            "peak": reader.metadata.peak_memory,
            "at_peak": sum(
                r.n_allocations for r in reader.get_high_watermark_allocation_records(True)
            ),
            "retained": sum(r.size for r in reader.get_leaked_allocation_records(True)),
            "samples": [(s.time, s.heap, s.rss) for s in reader.get_memory_snapshots()],
        }


@pytest.mark.parametrize("native_traces", [False, True])
def test_every_record_and_figure_as_memray_reads_them(
    capture: dict[str, Any], native_traces: bool
) -> None:
    fd = capture["start"](native_traces)
    reader = R.Reader(fd)
    assert reader.native_traces is native_traces and reader.pid == os.getpid()
    reader.open_window()
    keep: list[Any] = []
    _workload(keep)
    capture["stop"]()
    decoded: list[tuple[int, int, int, int]] = []
    assert reader.advance(collect=decoded) is False  # no marker: to the end of the capture
    peak, at_peak, retained, total, count, samples = reader.close_window()

    theirs = _memray_figures(capture["path"])
    assert len(decoded) > 5_000
    assert decoded == theirs["records"]
    kinds = {allocator for _, _, _, allocator in decoded}
    assert {
        memray.AllocatorType.MALLOC, memray.AllocatorType.CALLOC, memray.AllocatorType.REALLOC,
        memray.AllocatorType.FREE, memray.AllocatorType.MMAP, memray.AllocatorType.MUNMAP,
    } <= kinds
    assert len({tid for tid, *_ in decoded}) >= 2
    assert peak == theirs["peak"] and peak >= 28 * MIB
    assert at_peak == theirs["at_peak"]
    assert retained == theirs["retained"]
    assert len(samples) >= 3 and samples == theirs["samples"]
    allocations = [r for r in decoded if r[3] not in (
        memray.AllocatorType.FREE, memray.AllocatorType.MUNMAP, memray.AllocatorType.PYMALLOC_FREE,
    )]
    assert count == len(allocations) and total == sum(r[2] for r in allocations)
    del keep


def test_the_peak_is_its_last_record(capture: dict[str, Any]) -> None:
    """memray's high-water mark is the last record at the peak (>=): a malloc(0) right
    after the peak is reached adds an allocation live at the peak, and no bytes."""
    fd = capture["start"]()
    reader = R.Reader(fd)
    reader.open_window()
    block = bytearray(16 * MIB)
    zero = R.marker_alloc(0)
    del block
    R.marker_free(zero)
    capture["stop"]()
    assert reader.advance() is False
    peak, at_peak, *_ = reader.close_window()
    theirs = _memray_figures(capture["path"])
    assert (peak, at_peak) == (theirs["peak"], theirs["at_peak"])
    assert peak >= 16 * MIB


def test_a_window_between_markers_is_the_task_alone(capture: dict[str, Any]) -> None:
    fd = capture["start"]()
    reader = R.Reader(fd)
    before = bytearray(6 * MIB)  # allocated before the task, freed during it: not the task's
    start = R.marker_alloc(12_345)
    kept = bytearray(8 * MIB)
    transient = bytearray(20 * MIB)
    time.sleep(0.1)  # memray snapshots every 10 ms (on a loaded machine, later)
    del transient
    del before
    end = R.marker_alloc(12_345)
    after = bytearray(30 * MIB)  # after the end marker: not the task's
    assert reader.advance(start, 12_345) is True
    reader.open_window()
    assert reader.advance(end, 12_345) is True
    peak, at_peak, retained, total, count, samples = reader.close_window()
    R.marker_free(start)
    R.marker_free(end)
    capture["stop"]()
    assert 28 * MIB <= peak < 28 * MIB + SLACK, peak
    assert 8 * MIB <= retained < 8 * MIB + SLACK, retained
    assert at_peak >= 2 and count >= 2 and total >= 28 * MIB
    assert samples and all(s[1] <= peak for s in samples)
    assert max(s[1] for s in samples) >= 28 * MIB  # held across snapshots
    del kept, after


def test_the_reader_tells_between_which_snapshots_the_peak_fell(
    capture: dict[str, Any],
) -> None:
    """A peak held for less than memray's 10 ms is in no snapshot; the reader says
    how many snapshots came before it, so that the trace can place it."""
    fd = capture["start"]()
    reader = R.Reader(fd)
    start = R.marker_alloc(12_345)
    assert reader.advance(start, 12_345) is True
    reader.open_window()
    held = bytearray(MIB)
    time.sleep(0.06)  # snapshots before the spike
    before_ms = time.time() * 1000
    spike = bytearray(24 * MIB)  # allocated and freed between two snapshots (µs apart)
    del spike
    after_ms = time.time() * 1000
    time.sleep(0.06)  # and after it
    end = R.marker_alloc(12_345)
    assert reader.advance(end, 12_345) is True
    peak, *_, samples = reader.close_window()
    after = reader.peak_after
    R.marker_free(start)
    R.marker_free(end)
    capture["stop"]()
    assert 25 * MIB <= peak < 25 * MIB + SLACK, peak
    assert 0 < after < len(samples), (after, samples)
    # memray's snapshot times are whole ms, taken by its own thread: 2 ms of slack.
    assert all(ms <= after_ms + 2 for ms, _, _ in samples[:after]), (after_ms, samples)
    assert all(ms >= before_ms - 2 for ms, _, _ in samples[after:]), (before_ms, samples)
    del held


def test_reading_while_the_task_runs_adds_nothing_to_it(capture: dict[str, Any]) -> None:
    """The reader's own memory (its table of the task's live allocations, grown to
    100,000 entries here) is invisible to memray: reading a task's records halfway
    through, as the session's watcher does, leaves its figures as they are."""
    import sys

    fd = capture["start"]()
    reader = R.Reader(fd)
    start = R.marker_alloc(12_345)
    keep = [bytes(600 - 33) for _ in range(100_000)]
    assert sys.getsizeof(keep[0]) == 600
    middle = R.marker_alloc(12_329)
    assert reader.advance(start, 12_345)
    reader.open_window()
    assert reader.advance(middle, 12_329)  # the table grows now
    end = R.marker_alloc(12_345)
    assert reader.advance(end, 12_345)
    peak, _, retained, _, count, _ = reader.close_window()
    for marker in (start, middle, end):
        R.marker_free(marker)
    capture["stop"]()
    kept = 100_000 * (600 + 8)  # the blocks, and the list's pointers to them
    # (A table of malloc'd memory would add 4 MiB here.)
    assert kept <= retained <= peak <= kept + SLACK, (kept, retained, peak)
    assert count >= 100_000
    del keep


def test_reading_resumes_where_it_stopped_and_a_missing_marker_is_not_an_error(
    capture: dict[str, Any],
) -> None:
    fd = capture["start"]()
    reader = R.Reader(fd)
    keep: list[Any] = [bytearray(1000 + i) for i in range(500)]
    first: list[tuple[int, int, int, int]] = []
    assert reader.advance(0xDEAD0, 12_345, collect=first) is False  # never allocated
    marker = R.marker_alloc(12_361)
    assert reader.advance(marker, 12_361, collect=first) is True
    keep += [bytearray(3000 + i) for i in range(500)]
    R.marker_free(marker)
    capture["stop"]()
    second: list[tuple[int, int, int, int]] = []
    assert reader.advance(collect=second) is False
    records = _memray_figures(capture["path"])["records"]
    tid = records[len(first)][0]
    assert records == [*first, (tid, marker, 12_361, int(memray.AllocatorType.MALLOC)), *second]
    assert len(first) >= 500 and len(second) >= 500
    del keep


def test_pages_read_are_released(capture: dict[str, Any]) -> None:
    fd = capture["start"]()
    reader = R.Reader(fd)
    keep = [bytearray(600) for _ in range(300_000)]  # ~1 MB of records
    marker = R.marker_alloc(12_345)
    blocks_before = os.fstat(fd).st_blocks
    assert reader.advance(marker, 12_345) is True
    released = reader.release()
    assert released >= 512 * 1024, released
    # (The tracker writes on meanwhile: a few pages more.)
    assert os.fstat(fd).st_blocks * 512 <= blocks_before * 512 - released + 64 * 1024
    assert reader.release() == 0  # nothing more read since
    # The tracker writes on, and the reader reads on.
    more = [bytearray(700) for _ in range(1000)]
    second = R.marker_alloc(12_361)
    reader.open_window()
    assert reader.advance(second, 12_361) is True
    assert reader.close_window()[4] >= 1000
    R.marker_free(marker)
    R.marker_free(second)
    capture["stop"]()
    del keep, more


def test_other_captures_are_refused(capture: dict[str, Any], tmp_path: Path) -> None:
    fd = capture["start"]()
    keep = [bytearray(1000) for _ in range(100)]
    capture["stop"]()
    good = capture["path"].read_bytes()

    def reader_of(data: bytes) -> Any:
        path = tmp_path / "other.bin"
        path.write_bytes(data)
        other = os.open(path, os.O_RDONLY)
        try:
            return R.Reader(other)
        finally:
            os.close(other)

    assert reader_of(good).pid == os.getpid()
    newer = good[:7] + (R.HEADER_VERSION + 1).to_bytes(4, "little") + good[11:]
    with pytest.raises(ValueError, match="version 14"):
        reader_of(newer)
    with pytest.raises(ValueError, match="not a memray capture"):
        reader_of(b"x" * len(good))
    with pytest.raises(ValueError, match="no complete memray header"):
        reader_of(good[:30])
    aggregated = tmp_path / "aggregated.bin"
    with memray.Tracker(
        destination=memray.FileDestination(aggregated, compress_on_exit=False),
        file_format=memray.FileFormat.AGGREGATED_ALLOCATIONS,
    ):
        bytearray(1000)
    with pytest.raises(ValueError, match="not an ALL_ALLOCATIONS capture"):
        reader_of(aggregated.read_bytes())
    # A record memray does not write: refused where it is, with its offset.
    reader = R.Reader(fd)
    start = reader.offset
    corrupt = tmp_path / "corrupt.bin"
    shutil.copy(capture["path"], corrupt)
    with open(corrupt, "r+b") as f:
        f.seek(start)
        f.write(bytes([3]))  # no record type 3
    bad = os.open(corrupt, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match=f"offset {start} "):
            R.Reader(bad).advance()
    finally:
        os.close(bad)
    del keep

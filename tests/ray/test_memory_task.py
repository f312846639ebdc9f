"""Level 2 on the task side, in this process: real memray, one tracker at a time, fallbacks."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from tracer.ray import memory
from tracer.ray.task_metrics import TaskContext, measure_task

MIB = 1 << 20


def _ctx(task_id: str = "t", level: int = 2, native: bool = False) -> TaskContext:
    return TaskContext("exec", task_id, 0, level, native)


def _captures() -> set[str]:
    directory = memory._capture_dir()
    return {n for n in os.listdir(directory) if n.startswith(f"tracer-memray-{os.getpid()}-")}


def test_heap_peak_of_a_task() -> None:
    before = _captures()
    with measure_task(_ctx()) as m:
        block = bytearray(40 * MIB)
        time.sleep(0.05)  # a few 10 ms snapshots while it is held
        del block
        small = [bytes(64) for _ in range(1000)]
    assert small
    assert 40 * MIB <= m["heap_peak"] < 42 * MIB, m["heap_peak"]
    assert m["allocations"] >= 1 and m["heap_retained"] < 2 * MIB
    samples = m["memory_samples"]
    assert 3 <= len(samples) <= memory.MAX_SAMPLES
    assert max(h for _, h, _ in samples) >= 40 * MIB
    assert [t for t, _, _ in samples] == sorted(t for t, _, _ in samples)
    assert m["rss_peak"] >= max(r for _, _, r in samples)
    assert m["start_ns"] < m["end_ns"] and "memray" not in m
    assert _captures() == before  # the capture file is gone


def test_level_one_has_no_memray_figures() -> None:
    with measure_task(_ctx(level=1)) as m:
        bytearray(MIB)
    assert "heap_peak" not in m and "memory_samples" not in m
    assert m["rss_peak"] >= m["rss_start"] > 0


def test_native_traces_and_an_exception_keep_the_figures() -> None:
    with pytest.raises(ValueError) as info, measure_task(_ctx(native=True)) as m:
        keep = bytearray(8 * MIB)
        raise ValueError(len(keep))
    metrics: dict[str, Any] = info.value.__tracer_metrics__  # type: ignore[attr-defined]
    assert metrics is m and m["error_type"] == "ValueError"
    assert m["heap_peak"] >= 8 * MIB


def test_concurrent_tasks_fall_back_without_failing() -> None:
    results: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def task(name: str) -> None:
        try:
            barrier.wait()
            with measure_task(_ctx(name)) as m:
                time.sleep(0.15)
                block = bytearray(4 * MIB)
                time.sleep(0.05)
                del block
            results[name] = m
        except BaseException as exc:  # pragma: no cover - the point is that none happens
            errors.append(exc)

    threads = [threading.Thread(target=task, args=(f"c{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    statuses = sorted(m.get("memray", "ok") for m in results.values())
    assert statuses == ["shared", "unavailable", "unavailable"], statuses
    for m in results.values():
        assert m["rss_peak"] > 0 and m["end_ns"] > m["start_ns"]
        if m["memray"] == "shared":  # it saw the others' allocations too
            assert m["heap_peak"] >= 4 * MIB
        else:
            assert "heap_peak" not in m and "memray_reason" in m
    # Alone again: measured normally.
    with measure_task(_ctx("after")) as m:
        bytearray(2 * MIB)
    assert "memray" not in m and m["heap_peak"] >= 2 * MIB


def test_memray_failures_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import memray

    def broken_tracker(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("No more than one Tracker instance can be active at the same time")

    monkeypatch.setattr(memray, "Tracker", broken_tracker)
    with measure_task(_ctx("start")) as m:
        bytearray(MIB)
    assert m["memray"] == "unavailable" and "Tracker" in m["memray_reason"]
    assert "heap_peak" not in m and m["rss_peak"] > 0
    monkeypatch.undo()

    before = _captures()

    def broken_reader(path: str) -> Any:
        raise OSError("unreadable capture")

    monkeypatch.setattr(memray, "FileReader", broken_reader)
    with measure_task(_ctx("read")) as m:
        bytearray(MIB)
    assert m["memray"] == "unavailable" and "unreadable" in m["memray_reason"]
    assert "heap_peak" not in m and "memory_samples" not in m
    assert _captures() == before
    monkeypatch.undo()
    with measure_task(_ctx("again")) as m:  # the tracker lock was released
        bytearray(MIB)
    assert "memray" not in m


def test_stale_captures_of_dead_processes_are_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    directory = memory._capture_dir()
    stale = os.path.join(directory, "tracer-memray-999999999-deadbeef.bin")
    mine = os.path.join(directory, f"tracer-memray-{os.getpid()}-keep.bin")
    for path in (stale, mine):
        with open(path, "wb") as f:
            f.write(b"x")
    try:
        monkeypatch.setattr(memory, "_swept", False)
        with measure_task(_ctx()):
            pass
        assert not os.path.exists(stale) and os.path.exists(mine)
    finally:
        for path in (stale, mine):
            if os.path.exists(path):
                os.unlink(path)


def test_all_allocations_counts_every_allocation_of_the_task() -> None:
    ctx = TaskContext("exec", "t", 0, 2, False, False, True)  # memray_all_allocations
    with measure_task(ctx) as m:
        kept = [bytes(1000) for _ in range(5000)]  # ~5 MB in 5000 allocations
        for _ in range(10):
            bytearray(MIB)  # 10 MiB more, allocated and freed: counted, not in the peak
    assert kept
    assert m["allocation_count"] >= 5000 + 10
    assert m["total_allocated"] >= 5000 * 1000 + 10 * MIB
    assert m["heap_peak"] < m["total_allocated"]
    # The default aggregated capture cannot count them: no such figures.
    with measure_task(_ctx()) as m2:
        bytes(1000)
    assert "total_allocated" not in m2 and "allocation_count" not in m2


#: Run in a fresh interpreter: RSS is the whole process's, and in the test session
#: what earlier tests left (threads, memray's tracker of level-2 tests, libraries'
#: allocators) decides whether a freed block goes back to the system: once, in the
#: full suite, neither the parent's nor a forked child's 100 MiB moved it.
_RSS_CHECKS = """
import os, sys
from tracer.ray import task_metrics
from tracer.ray.task_metrics import current_rss
MIB = 1 << 20

def follows_this_process_and_a_forked_child():
    # The /proc file stays open between reads: each read is fresh, and a child reads
    # its own (the fork is the point: the child must not read its parent's cached file).
    base = current_rss()
    block = bytearray(os.urandom(1)) * (200 * MIB)  # touched: resident
    grown = current_rss()
    assert grown - base >= 190 * MIB, (base, grown)
    del block
    assert current_rss() < grown - 150 * MIB
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: allocate, measure, report, exit without cleanup
        try:
            child_base = current_rss()
            child_block = bytearray(os.urandom(1)) * (100 * MIB)
            assert task_metrics._PID == os.getpid()  # what a task of the child reports
            os.write(write, f"{child_base} {current_rss()} {len(child_block)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child_base, child_grown, _ = map(int, f.read().split())
    os.waitpid(pid, 0)
    assert child_grown - child_base >= 90 * MIB, (child_base, child_grown)

def survives_its_file_being_closed():
    # Someone closing the kept descriptor costs one fallback reading, not every later one.
    task_metrics.current_rss()
    statm = task_metrics._STATM
    assert statm is not None
    os.close(statm)
    assert task_metrics.current_rss() > 0  # the fallback: peak RSS
    block = bytearray(os.urandom(1)) * (100 * MIB)
    grown = task_metrics.current_rss()  # reopened: the current RSS again
    del block
    assert task_metrics.current_rss() < grown - 50 * MIB

def peak_rss_is_the_whole_processs():
    # Read through getrusage(RUSAGE_THREAD): the process's high-water mark all the same,
    # whichever thread raised it.
    import threading
    before = current_rss()  # the high-water mark may be above it already
    def grow():
        block = bytearray(os.urandom(1)) * (200 * MIB)
        assert len(block)
    worker = threading.Thread(target=grow)
    worker.start()
    worker.join()
    after = task_metrics.peak_rss()
    assert after - before >= 190 * MIB, (before, after)
    seen = []
    reader = threading.Thread(target=lambda: seen.append(task_metrics.peak_rss()))
    reader.start()
    reader.join()
    assert seen[0] >= after, (seen, after)

globals()[sys.argv[1]]()
"""


def _rss_check(name: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _RSS_CHECKS, name], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_current_rss_follows_this_process_and_a_forked_child() -> None:
    """The /proc file stays open between reads: each read is fresh, and a child reads its own."""
    _rss_check("follows_this_process_and_a_forked_child")


def test_peak_rss_is_the_whole_processs_whichever_thread_raised_it() -> None:
    """The peak RSS is read per thread (cheaper), yet is the process's: Linux reports
    the memory high-water mark its threads share."""
    _rss_check("peak_rss_is_the_whole_processs")


def test_current_rss_survives_its_file_being_closed() -> None:
    """Someone closing the kept descriptor costs one fallback reading, not every later one."""
    _rss_check("survives_its_file_being_closed")

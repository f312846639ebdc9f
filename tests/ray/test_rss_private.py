"""A task's RSS figures leave shared memory out: the object store's pages a worker mapped.

A Ray worker writes every return value into the object store, which it maps:
those pages stayed in its RSS (as shared memory), so level 1's figures
(``rss_start``, ``rss_end``, ``rss_peak``; ``memory_peak`` in the trace)
grew with every task the worker ran, by the size of the returns before, and
``tracer memory --suggest`` asked for that much more. They are now the
private memory (RSS minus shared, as Ray's docs count a worker's memory;
:func:`tracer.ray.task_metrics.rss_and_shared`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray_trace_checks import RunnerTrace, check_runner_trace

from tracer.format import Slice, TrackInfo
from tracer.ray import layout as L
from tracer.ray.task_metrics import TaskContext, measure_task
from tracer.runner import Pipeline, Stage

MIB = 1 << 20
#: What each task returns: two of them fit the tests' 75 MiB object store
#: below Ray's spilling threshold (80%), so the third task's worker has both mapped.
RETURN_SIZE = 25 * MIB


def _returns_bytes(size: int) -> bytes:
    return b"\x01" * size  # allocated and written by the task: private memory


def _worker_of(rt: RunnerTrace, execution: Slice) -> str:
    """The "worker <pid>" track an execution is on (or under: an overlap lane)."""
    track: TrackInfo | None = rt.model.tracks[execution.track_uuid]
    while track is not None and not (track.name or "").startswith(L.WORKER_THREAD_PREFIX + " "):
        track = rt.model.parent_of(track.uuid)
    assert track is not None
    return str(track.name)


@pytest.mark.usefixtures("ray_local")
def test_identical_tasks_of_one_worker_have_the_same_memory_peak(tmp_path: Path) -> None:
    """Each task returns 25 MiB, held by the driver (fetch=False), so each lands in new
    pages of the object store that its worker maps. The old figures grew by 25 MiB a
    task (the returns before, as shared memory); the private peak stays put and still
    counts the 25 MiB the task allocated itself."""
    path = tmp_path / "returns.perfetto-trace"
    # One task at a time (2 CPUs each on the 2-CPU node): Ray keeps the lease, one worker.
    stage = Stage("returns", _returns_bytes, num_cpus=2)
    refs = Pipeline([RETURN_SIZE] * 3, [stage]).run(
        tracing_level=1, trace_path=path, progress=False, fetch=False
    )
    try:
        rt = check_runner_trace(path, {"returns": 3})
        executions = sorted(rt.executions, key=lambda e: e.ts)
        assert len({_worker_of(rt, e) for e in executions}) == 1, "not one worker"
        peaks = [int(e.args[L.ARG_MEMORY_PEAK]) for e in executions]
        assert L.ARG_HEAP_PEAK not in executions[0].args  # level 1: the RSS's peak
        # Before: ~+25 MiB a task (e.g. 153, 183, 213 MiB for 30 MiB returns).
        assert max(peaks) - min(peaks) < RETURN_SIZE // 2, [p / MIB for p in peaks]
        assert min(peaks) >= RETURN_SIZE, [p / MIB for p in peaks]
    finally:
        del refs


#: Run in a fresh process: the peak comes from the process's lifetime high-water mark,
#: which in the test session earlier tests may have set above anything here. Forked
#: once more: a process started by ``exec`` inherits the high-water mark of the
#: process that started it (the test session's, hundreds of MiB, in ``ru_maxrss``),
#: a forked child only its parent's (this small interpreter's).
_CHECKS = """
import mmap, os, sys, traceback
from tracer.ray.task_metrics import TaskContext, measure_task, rss_and_shared
MIB = 1 << 20
PAGE = mmap.PAGESIZE
CTX = TaskContext("exec", "t", 0, 1)

def touch(area, start, size):
    for offset in range(start, start + size, PAGE):
        area[offset] = 1

def checks():
    # Anonymous MAP_SHARED memory is shared memory to Linux (RssShmem), as the object
    # store's pages are to a Ray worker.
    area = mmap.mmap(-1, 400 * MIB)

    # 1. A task that maps 200 MiB of shared memory is not charged for it.
    with measure_task(CTX) as m:
        touch(area, 0, 200 * MIB)
    private, shared = rss_and_shared()
    assert shared >= 200 * MIB, shared
    assert m["rss_end"] - m["rss_start"] < 10 * MIB, m
    assert m["rss_peak"] - m["rss_start"] < 10 * MIB, m

    # 2. With the 200 MiB mapped (the high-water mark above it), a task that allocates
    # 100 MiB and frees it: its peak counts the 100 MiB, not the shared 200.
    with measure_task(CTX) as m:
        block = bytearray(b"\\1") * (100 * MIB)
        del block
    assert 90 * MIB <= m["rss_peak"] - m["rss_start"] < 110 * MIB, m
    assert m["rss_end"] - m["rss_start"] < 10 * MIB, m

    # 3. Shared memory growing during the task (arguments read zero-copy), then 150 MiB
    # allocated and freed: the peak counts the 150 MiB, none of the 100 MiB mapped.
    with measure_task(CTX) as m:
        touch(area, 200 * MIB, 100 * MIB)
        block = bytearray(b"\\1") * (150 * MIB)
        del block
    assert 140 * MIB <= m["rss_peak"] - m["rss_start"] < 160 * MIB, m

    # 4. The high-water mark is the task's own: a task allocating 50 MiB after those of
    # 100 and 150 still peaks 50 MiB over its start (it was measured at its start and
    # end only, ~0: its peak stayed under the earlier tasks' mark).
    with measure_task(CTX) as m:
        block = bytearray(b"\\1") * (50 * MIB)
        del block
    assert 45 * MIB <= m["rss_peak"] - m["rss_start"] < 60 * MIB, m

pid = os.fork()
if pid == 0:
    code = 1
    try:
        checks()
        print("ok", flush=True)
        code = 0
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_level_one_figures_leave_shared_memory_out() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHECKS], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


def test_level_two_rss_figures_and_samples_leave_shared_memory_out() -> None:
    """memray's snapshots read the whole RSS: the same shared memory is taken out of
    them, so a worker's RSS counter (start, memray's samples, end) is one quantity."""
    import mmap

    area = mmap.mmap(-1, 100 * MIB)
    try:
        with measure_task(TaskContext("exec", "t", 0, 2)) as m:
            for offset in range(0, 100 * MIB, mmap.PAGESIZE):  # mapped as it runs
                area[offset] = 1
            block = bytearray(40 * MIB)
            block[:: mmap.PAGESIZE] = b"\x01" * len(block[:: mmap.PAGESIZE])
            time.sleep(0.05)  # a few of memray's 10 ms snapshots while it is held
            del block
    finally:
        area.close()
    assert m["heap_peak"] >= 40 * MIB
    samples = m["memory_samples"]
    assert samples and max(r for _, _, r in samples) <= m["rss_peak"]
    # Private: the task's 40 MiB over its start, not the 100 MiB shared as well.
    grown = m["rss_peak"] - m["rss_start"]
    assert 35 * MIB <= grown < 80 * MIB, grown / MIB
    # Nor at its end (the 40 MiB may stay with the allocator: this process ran others).
    assert m["rss_end"] - m["rss_start"] < 60 * MIB, m

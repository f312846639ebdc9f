"""Level-2 memory measurement of one task, with memray.

At tracing level 2 every traced task is measured by memray, in its cheapest
mode: Python allocators not traced one by one, no native stacks unless asked
for (``ray_tracer(..., memray_native_traces=True)``). How depends on the
process:

* in a **Ray worker**, one tracker runs for the process and each task reads
  its own part of memray's stream (:mod:`tracer.ray.memory_session`): a task
  pays two marker allocations and the reading, tens of microseconds for a
  small task;
* anywhere else (a driver measuring itself, a script, a test), and in a
  worker when the session cannot be used (no C extension, a memray whose
  stream the reader does not know, ``TRACER_MEMRAY_PER_TASK=1``), a tracker
  runs around the task alone, writing an aggregated capture to ``/dev/shm``
  (or the temp folder) that memray's public ``FileReader`` reads as soon as
  the tracker stops; the file is then deleted. Its start and stop cost ~8 ms
  each in a Ray worker (memray patches, then restores, the relocation tables
  of every loaded library), which is why workers use the session. Outside a
  worker the process is the user's: memray tracks it only while the task runs.

Both give the task's metrics dict the same figures:

``heap_peak``
    memray's heap high-water mark of the task: the most bytes allocated (by
    ``malloc``/``mmap`` and friends, from any thread of the worker) and not
    yet freed at one time while the task ran, counting only allocations made
    during the task. This is the task's real peak heap use, but for memory of
    allocators memray cannot see (Arrow's own pool: a worker's Arrow is moved
    to ``malloc`` first, see :mod:`tracer.ray.arrow_memory`).
``allocations``
    how many allocations were live at that peak.
``heap_retained``
    bytes the task allocated and had not freed when it ended (typically its
    result, before Ray serialises it).
``memory_samples``
    memray's memory snapshots (every 10 ms: process RSS and the task's heap)
    as ``(time_ms, heap_bytes, rss_bytes)`` tuples, downsampled to at most
    :data:`MAX_SAMPLES` per task (each kept sample is the maximum of the ones
    it replaces, so peaks survive). memray reads the whole RSS: the task's
    end takes the shared memory out (``task_metrics._finish``), as from
    level 1's figures.
``rss_peak``
    the largest RSS among the snapshots (merged with level 1's estimate, the
    shared memory taken out the same way).
``heap_peak_at_ns``
    when the heap peak was reached (epoch ns), only when no snapshot shows
    it: a peak held for less than memray's 10 ms falls between two snapshots,
    and the worker's heap counter would never reach what the task's
    ``heap_peak`` says (a short task often has no snapshot at all). The
    session's reader knows between which two snapshots the peak fell (or the
    task's start or end), and this is the middle of that gap: off by at most
    half the gap (~5 ms; more when memray's snapshot thread was kept waiting).
    A tracker per task cannot tell (memray's reader gives no time for its
    high-water mark), so there it is the middle of the task.

``total_allocated``, ``allocation_count``
    every allocation of the task, summed: only with
    ``ray_tracer(..., memray_all_allocations=True)``. The session reads every
    allocation anyway, so in a worker they cost nothing more; a tracker per
    task then records every allocation (memray's ``FileFormat.ALL_ALLOCATIONS``:
    bigger capture files, read in proportion to the allocations) instead of
    its aggregated capture, which cannot count them.

**One tracker per process.** memray allows a single active tracker per
process, and it sees the allocations of every thread. A task that starts
while another task of the same worker process is being measured (threaded
actors, ``max_concurrency > 1``) is not measured: it keeps its level-1
figures and is marked ``memray: "unavailable"`` (with ``memray_reason``). The
task being measured while others run is marked ``memray: "shared"``: its
heap figures include the other tasks' allocations (an upper bound of its
own). Any memray failure (import, start, stop, read) also falls back to
level 1 with ``memray: "unavailable"``; the task itself never fails because
of tracing.

The task's ``start_ns``/``end_ns`` are taken inside the measurement (after
the tracker's start or the start marker, before the end marker or the
tracker's stop), so execution slices show the task's own time.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = [
    "MAX_SAMPLES",
    "MEMRAY_PER_TASK",
    "MEMRAY_SHARED",
    "MEMRAY_UNAVAILABLE",
    "downsample",
    "track_task_memory",
]

#: At most this many memory snapshots per task travel back to the driver.
MAX_SAMPLES = 200
#: memray's snapshot period.
SNAPSHOT_INTERVAL_MS = 10

#: ``memray`` status of a task measured at level 1 only (see the module doc).
MEMRAY_UNAVAILABLE = "unavailable"
#: ``memray`` status of a task whose figures include concurrent tasks' allocations.
MEMRAY_SHARED = "shared"
#: ``memray`` status of a task measured by a tracker of its own in a Ray worker (the
#: slower way: see tracer.ray.layout.MEMRAY_PER_TASK).
MEMRAY_PER_TASK = "per_task"  # tracer.ray.layout's (this module imports none of tracer)

Sample = tuple[int, int, int]  # (time_ms, heap_bytes, rss_bytes)
_NS_PER_MS = 1_000_000

_tracker_lock = threading.Lock()  # held while a task of this process is measured by memray
_state_lock = threading.Lock()
_running = 0  # tasks of this process inside track_task_memory
_started = 0  # tasks of this process that entered track_task_memory, ever


_CAPTURE_PREFIX = "tracer-memray-"
_swept = False  # stale capture files of dead processes removed (once per process)


def _capture_dir() -> str:
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


def _sweep(directory: str) -> None:
    """Remove capture files left by worker processes that died mid-task (e.g. OOM-killed)."""
    global _swept
    _swept = True
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if not name.startswith(_CAPTURE_PREFIX):
                continue
            pid = name[len(_CAPTURE_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                _remove(os.path.join(directory, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


class _Capture:
    """A tracker around one task, and its capture file (memray's public API only)."""

    __slots__ = ("path", "tracker")

    def __init__(self, tracker: Any, path: str) -> None:
        self.tracker = tracker
        self.path = path


#: Figures that a failed measurement must not leave behind.
_FIGURES = (
    "heap_peak", "allocations", "heap_retained", "memory_samples", "total_allocated",
    "allocation_count",
)


def _unavailable(metrics: dict[str, Any], reason: str) -> None:
    for key in _FIGURES:
        metrics.pop(key, None)
    metrics["memray"] = MEMRAY_UNAVAILABLE
    metrics["memray_reason"] = reason[:200]


def _start(metrics: dict[str, Any], native_traces: bool, all_allocations: bool) -> _Capture | None:
    """Start a tracker for this task alone (``_tracker_lock`` is held)."""
    directory = _capture_dir()
    if not _swept:
        _sweep(directory)
    path = os.path.join(directory, f"{_CAPTURE_PREFIX}{os.getpid()}-{uuid.uuid4().hex}.bin")
    try:
        import memray

        tracker = memray.Tracker(
            destination=memray.FileDestination(path, overwrite=True, compress_on_exit=False),
            native_traces=native_traces,
            memory_interval_ms=SNAPSHOT_INTERVAL_MS,
            file_format=(
                memray.FileFormat.ALL_ALLOCATIONS
                if all_allocations
                else memray.FileFormat.AGGREGATED_ALLOCATIONS
            ),
        )
        tracker.__enter__()
    except Exception as exc:  # e.g. a tracker started by someone else, or no memray
        _remove(path)
        _unavailable(metrics, f"{type(exc).__name__}: {exc}")
        return None
    return _Capture(tracker, path)


def _stop(capture: _Capture, metrics: dict[str, Any], all_allocations: bool) -> None:
    """Stop the task's tracker and read its capture into ``metrics``."""
    try:
        capture.tracker.__exit__(None, None, None)
        _read(capture.path, metrics, all_allocations)
    finally:
        _remove(capture.path)


def _read(path: str, metrics: dict[str, Any], all_allocations: bool) -> None:
    """Put the figures of a finished capture file into ``metrics``."""
    import memray

    reader = memray.FileReader(path)
    totals: tuple[int, int] | None = None
    try:
        peak = int(reader.metadata.peak_memory)
        at_peak = sum(
            r.n_allocations for r in reader.get_high_watermark_allocation_records(True)
        )
        retained = sum(r.size for r in reader.get_leaked_allocation_records(True))
        snapshots = [
            (int(s.time), int(s.heap), int(s.rss)) for s in reader.get_memory_snapshots()
        ]
        if all_allocations and reader.metadata.file_format == memray.FileFormat.ALL_ALLOCATIONS:
            total = count = 0
            for record in reader.get_allocation_records():
                if record.size:  # deallocations carry no size
                    total += record.size
                    count += 1
            totals = (total, count)
    finally:
        reader.close()
    put_figures(metrics, peak, int(at_peak), int(retained), snapshots, totals)


def put_figures(
    metrics: dict[str, Any],
    peak: int,
    at_peak: int,
    retained: int,
    snapshots: Sequence[Sample],
    totals: tuple[int, int] | None = None,
    peak_after: int | None = None,
) -> None:
    """Put a task's memray figures into its metrics (both methods end here).

    ``peak_after``: how many snapshots came before the peak, when known.
    """
    metrics["heap_peak"] = peak = int(peak)
    metrics["allocations"] = int(at_peak)
    metrics["heap_retained"] = int(retained)
    if totals is not None:
        metrics["total_allocated"], metrics["allocation_count"] = int(totals[0]), int(totals[1])
    if snapshots:
        metrics["memory_samples"] = downsample(snapshots, MAX_SAMPLES)
        rss_max = max(s[2] for s in snapshots)
        metrics["rss_peak"] = max(int(metrics.get("rss_peak") or 0), int(rss_max))
    if peak > 0 and all(s[1] < peak for s in snapshots):
        at = peak_time(snapshots, peak_after, metrics.get("start_ns"), metrics.get("end_ns"))
        if at is not None:
            metrics["heap_peak_at_ns"] = at


def peak_time(
    snapshots: Sequence[Sample], peak_after: int | None, start_ns: Any, end_ns: Any
) -> int | None:
    """The middle of the gap the peak fell in (epoch ns), or None without bounds.

    The gap runs from the snapshot before the peak (else the task's start) to
    the one after it (else the task's end); without ``peak_after``, it is the
    whole task.
    """
    lo = start_ns if isinstance(start_ns, int) else None
    hi = end_ns if isinstance(end_ns, int) else None
    if peak_after is not None and 0 <= peak_after <= len(snapshots):
        if peak_after > 0:
            lo = int(snapshots[peak_after - 1][0]) * _NS_PER_MS
        if peak_after < len(snapshots):
            hi = int(snapshots[peak_after][0]) * _NS_PER_MS
    if lo is None or hi is None:
        return None
    return (lo + hi) // 2


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def downsample(samples: Sequence[Sample], limit: int = MAX_SAMPLES) -> list[Sample]:
    """At most ``limit`` samples: consecutive runs merged into (first time, max heap, max rss)."""
    n = len(samples)
    if n <= limit:
        return list(samples)
    out: list[Sample] = []
    # Bucket i covers samples [i * n // limit, (i + 1) * n // limit): all non-empty.
    for i in range(limit):
        bucket = samples[i * n // limit : (i + 1) * n // limit]
        out.append(
            (bucket[0][0], max(s[1] for s in bucket), max(s[2] for s in bucket))
        )
    return out


@contextlib.contextmanager
def track_task_memory(
    metrics: dict[str, Any], *, native_traces: bool = False, all_allocations: bool = False
) -> Iterator[None]:
    """Measure the body with memray and add its figures to ``metrics`` (see the module doc).

    ``all_allocations`` also sums every allocation (``total_allocated``,
    ``allocation_count``); with a tracker per task it records every
    allocation (memray's ``ALL_ALLOCATIONS``), which costs more.

    Sets ``start_ns``/``end_ns`` inside the measurement when memray measures
    the task, so the task's times leave memray's overhead out.
    """
    global _running, _started
    with _state_lock:
        _running += 1
        _started += 1
        started = _started
        overlapped = _running > 1
    finish = _begin(metrics, native_traces, all_allocations)
    if finish is not None:
        metrics["start_ns"] = time.time_ns()
    try:
        yield
    finally:
        if finish is not None:
            metrics["end_ns"] = time.time_ns()
        with _state_lock:
            overlapped = overlapped or _started != started or _running > 1
            _running -= 1
        if finish is not None:
            _finish(finish, metrics, overlapped)


def _say_per_task(reason: str) -> None:
    """Once per worker process (Ray shows a worker's warnings on the driver's console):
    level 2 runs the slower way here, and why, unless the user asked for it."""
    from tracer._env import warn_once
    from tracer.ray.memory_session import PER_TASK_ENV

    if PER_TASK_ENV in reason:
        return
    warn_once(
        f"tracer: level 2 measures each task of this worker with a memray tracker of its "
        f"own, ~20-90 ms more a task than one tracker for the process, because {reason}; "
        "a C compiler when tracer is installed builds what the cheaper way needs"
    )


def _begin(
    metrics: dict[str, Any], native_traces: bool, all_allocations: bool
) -> Callable[[], None] | None:
    """Start measuring; returns what completes the measurement, or None (unavailable).

    On success ``_tracker_lock`` stays held until :func:`_finish` runs.
    """
    if not _tracker_lock.acquire(blocking=False):
        _unavailable(metrics, "another task of this worker process is being measured by memray")
        return None
    try:
        if _in_ray_worker():
            from tracer.ray import memory_session
            from tracer.ray.arrow_memory import arrow_on_system_pool

            arrow_on_system_pool()  # else memray sees none of Arrow's buffers

            reason = memory_session.disabled_reason()
            if reason is not None:
                memory_session.stop()  # one started before must not keep memray's one tracker
                _say_per_task(reason)
            else:
                began = memory_session.begin(native_traces)
                if not isinstance(began, str):
                    return lambda: memory_session.end(began, metrics, all_allocations)
                reason = memory_session.disabled_reason()
                if reason is None:  # this task's failure
                    _unavailable(metrics, began)
                    _tracker_lock.release()
                    return None
                # The reader refused this memray: a tracker per task from now on.
                _say_per_task(reason)
            per_task: str | None = reason
        else:
            per_task = None  # outside Ray (a test, a local run): the only way there is
        capture = _start(metrics, native_traces, all_allocations)
    except BaseException:
        _tracker_lock.release()
        raise
    if capture is None:
        _tracker_lock.release()
        return None
    if per_task is not None:  # said on the execution and counted on the run (the layout)
        metrics["memray"] = MEMRAY_PER_TASK
        metrics["memray_reason"] = per_task
    return lambda: _stop(capture, metrics, all_allocations)


def _finish(finish: Callable[[], None], metrics: dict[str, Any], overlapped: bool) -> None:
    try:
        finish()
        if overlapped:
            metrics["memray"] = MEMRAY_SHARED
    except Exception as exc:
        _unavailable(metrics, f"{type(exc).__name__}: {exc}")
    finally:
        _tracker_lock.release()


def _in_ray_worker() -> bool:
    """This process is a Ray worker (its measurements found Ray there; see task_metrics:
    a forked child forgets its parent's)."""
    from tracer.ray import task_metrics

    return task_metrics._PROCESS is not None

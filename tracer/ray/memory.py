"""Level-2 memory measurement of one task, with memray.

At tracing level 2 every traced task runs under a ``memray.Tracker`` in its
cheapest mode: the aggregated capture format (one record per allocating
location, not per allocation), no native stacks unless asked for
(``ray_tracer(..., memray_native_traces=True)``), a capture file in
``/dev/shm`` (or the temp folder) that is read with memray's public
``FileReader`` as soon as the tracker stops, then deleted. The task's
metrics dict gets:

``heap_peak``
    memray's heap high-water mark of the task: the most bytes allocated (by
    ``malloc``/``mmap`` and friends, from any thread of the worker) and not
    yet freed at one time while the task ran, counting only allocations made
    during the task. This is the task's real peak heap use.
``allocations``
    how many allocations were live at that peak.
``heap_retained``
    bytes the task allocated and had not freed when it ended (typically its
    result, before Ray serialises it).
``memory_samples``
    memray's memory snapshots (every 10 ms: process RSS and the task's heap)
    as ``(time_ms, heap_bytes, rss_bytes)`` tuples, downsampled to at most
    :data:`MAX_SAMPLES` per task (each kept sample is the maximum of the ones
    it replaces, so peaks survive).
``rss_peak``
    the largest RSS among the snapshots (merged with level 1's estimate).

``total_allocated``, ``allocation_count``
    every allocation of the task, summed: only with
    ``ray_tracer(..., memray_all_allocations=True)``, which records every
    allocation (memray's ``FileFormat.ALL_ALLOCATIONS``: bigger capture files,
    and reading them costs in proportion to the allocations). memray's
    aggregated captures, the default, cannot count them.

**One tracker per process.** memray allows a single active tracker per
process, and it sees the allocations of every thread. A task that starts
while another task of the same worker process holds the tracker (threaded
actors, ``max_concurrency > 1``) is not tracked: it keeps its level-1 figures
and is marked ``memray: "unavailable"`` (with ``memray_reason``). The task
that holds the tracker while others run is marked ``memray: "shared"``: its
heap figures include the other tasks' allocations. Any memray failure
(import, start, stop, read) also falls back to level 1 with
``memray: "unavailable"``; the task itself never fails because of tracing.

The tracker's start and stop cost about 9 ms each in a Ray worker (memray
patches the symbol tables of every loaded library, and Ray's are big); the
task's ``start_ns``/``end_ns`` are taken inside them, so execution slices show
the task's own time.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "MAX_SAMPLES",
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

Sample = tuple[int, int, int]  # (time_ms, heap_bytes, rss_bytes)

_tracker_lock = threading.Lock()  # held while this process has a memray tracker active
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


class _Session:
    """One active memray tracker and its capture file."""

    __slots__ = ("path", "tracker")

    def __init__(self, tracker: Any, path: str) -> None:
        self.tracker = tracker
        self.path = path


def _unavailable(metrics: dict[str, Any], reason: str) -> None:
    metrics["memray"] = MEMRAY_UNAVAILABLE
    metrics["memray_reason"] = reason[:200]


def _start(metrics: dict[str, Any], native_traces: bool, all_allocations: bool) -> _Session | None:
    if not _tracker_lock.acquire(blocking=False):
        _unavailable(metrics, "another task of this worker process holds the memray tracker")
        return None
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
        _tracker_lock.release()
        _remove(path)
        _unavailable(metrics, f"{type(exc).__name__}: {exc}")
        return None
    return _Session(tracker, path)


def _stop(session: _Session, metrics: dict[str, Any], overlapped: bool) -> None:
    try:
        try:
            session.tracker.__exit__(None, None, None)
        finally:
            _tracker_lock.release()
        _read(session.path, metrics)
        if overlapped:
            metrics["memray"] = MEMRAY_SHARED
    except Exception as exc:
        for key in (
            "heap_peak", "allocations", "heap_retained", "memory_samples",
            "total_allocated", "allocation_count",
        ):
            metrics.pop(key, None)
        _unavailable(metrics, f"{type(exc).__name__}: {exc}")
    finally:
        _remove(session.path)


def _read(path: str, metrics: dict[str, Any]) -> None:
    """Put the figures of a finished capture file into ``metrics``."""
    import memray

    reader = memray.FileReader(path)
    try:
        peak = int(reader.metadata.peak_memory)
        at_peak = sum(
            r.n_allocations for r in reader.get_high_watermark_allocation_records(True)
        )
        retained = sum(r.size for r in reader.get_leaked_allocation_records(True))
        snapshots = [
            (int(s.time), int(s.heap), int(s.rss)) for s in reader.get_memory_snapshots()
        ]
        if reader.metadata.file_format == memray.FileFormat.ALL_ALLOCATIONS:
            total = count = 0
            for record in reader.get_allocation_records():
                if record.size:  # deallocations carry no size
                    total += record.size
                    count += 1
            metrics["total_allocated"] = total
            metrics["allocation_count"] = count
    finally:
        reader.close()
    metrics["heap_peak"] = peak
    metrics["allocations"] = int(at_peak)
    metrics["heap_retained"] = int(retained)
    if snapshots:
        metrics["memory_samples"] = downsample(snapshots, MAX_SAMPLES)
        rss_max = max(s[2] for s in snapshots)
        metrics["rss_peak"] = max(int(metrics.get("rss_peak") or 0), rss_max)


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
    """Run the body under memray and add its figures to ``metrics`` (see the module doc).

    ``all_allocations`` records every allocation (memray's ``ALL_ALLOCATIONS``
    format) so the totals (``total_allocated``, ``allocation_count``) can be
    counted; it costs more than the default aggregated capture.

    Sets ``start_ns``/``end_ns`` inside the tracker's start and stop when the
    tracker runs, so the task's times leave memray's overhead out.
    """
    global _running, _started
    with _state_lock:
        _running += 1
        _started += 1
        started = _started
        overlapped = _running > 1
    session = _start(metrics, native_traces, all_allocations)
    if session is not None:
        metrics["start_ns"] = time.time_ns()
    try:
        yield
    finally:
        if session is not None:
            metrics["end_ns"] = time.time_ns()
        with _state_lock:
            overlapped = overlapped or _started != started or _running > 1
            _running -= 1
        if session is not None:
            _stop(session, metrics, overlapped)

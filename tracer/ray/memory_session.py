"""Level 2 in a Ray worker: one memray tracker per process, read task by task.

Starting and stopping a ``memray.Tracker`` costs ~8-10 ms each in a Ray worker
(memray patches, then restores, the relocation tables of every loaded
library), which made level 2 cost ~20 ms per task. So in a Ray worker
process the first level-2 task starts one tracker for the process, writing
memray's ALL_ALLOCATIONS stream to a capture file, and every level-2 task
after it costs two small marker allocations and reading its part of the
stream:

* at a task's start, a *marker* (a ``malloc`` of an unusual size) goes into
  the stream; at its end, another. memray writes an allocation's record before
  ``malloc`` returns, so once the end marker is allocated, the task's records
  are all in the file;
* :class:`tracer.ray._memray_reader.Reader` (C) reads the stream from where
  it stopped to the end marker, and over the records between the two markers
  does what memray's own reader does over a capture of its own: so a task's
  ``heap_peak``, ``allocations`` (live at the peak), ``heap_retained``,
  totals and 10 ms ``memory_samples`` are those a tracker started and stopped
  with the task would give (``tests/ray/test_memory_reader.py`` checks them
  against memray's ``FileReader``); it also tells between which two samples
  the peak fell (``Reader.peak_after``), which memray's reader cannot: a
  peak shorter than 10 ms is in no sample, and the trace places it there;
* what was read is released (the file's pages are punched out), so the
  capture holds only what the tracker wrote since the last task ended.

Reading memray's stream is not part of memray's public API: the reader is
used only with the memray releases it was checked against (:data:`KNOWN_MEMRAY`,
1.20) and a capture whose header says format version 13; with any other
memray, or a header it does not recognise, level 2 runs a tracker around
every task (:mod:`tracer.ray.memory`, memray's public API only: the same
figures in the trace, ~20 ms more per task), as it does without the C
extension. ``TRACER_MEMRAY_PER_TASK=1`` asks for that method everywhere
(benchmarks compare the two).

**Why not memray's public readers here** (measured, benchmarks/README.md and
``benchmarks/bench_memray_public.py``): ``memray.FileReader`` reads a capture
from its start; it has no way to resume where it stopped, so following a
worker's one live capture with it re-reads everything each task, and its own
allocations while reading are tracked into the same capture (each read
roughly doubles it): in a Ray worker, empty tasks, the first task's read took
0.16-0.22 s, the 6th 6-12 s (2.3 million records), the 7th 28 s (4.5 million),
against 21-24 ms for a tracker per task. ``memray.SocketReader`` (a live
``SocketDestination``) gives only the allocations live at the moment it is
asked (``get_current_snapshot``): no heap peak over an interval, no 10 ms
heap/RSS samples. Starting and stopping a tracker per task (the fallback) is
the public API that gives the trace's figures, at ~20 ms a task; the reader
gives the same figures at a few microseconds.

**Lifetime.** The capture file is unlinked as soon as it is opened: it lives
in the open file only, so a worker killed by the OOM killer leaves nothing
behind. The tracker stops once no level-2 task has run in the process for
:data:`IDLE_SECONDS` (a daemon thread looks every :data:`WATCH_SECONDS`), so
untraced tasks, or level-1 ones, that the reused worker runs next are not
slowed for longer than that; and it stops at exit. The same thread reads a
long task's records while it runs (:meth:`Session.drain`), so the capture
holds at most ~0.5 s of them. A forked child does not inherit it (memray
stops tracking in the child; this module forgets it there), and memray cannot
start another there (the tracker's patches of ``threading`` are inherited):
a level-2 task measured in such a child is unavailable. Anything going
wrong (no memray, a tracker that fails to start, a stream that does not read
as expected) marks the task ``memray: "unavailable"`` with the reason, drops
the session, and the next task starts a new one: the task itself never fails.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from tracer._env import env_flag
from tracer.ray import memory as _memory

if TYPE_CHECKING:
    from tracer.ray._memray_reader import Reader, Window

__all__ = [
    "IDLE_SECONDS", "PER_TASK_ENV", "WATCH_SECONDS", "Session", "begin", "disabled_reason", "end",
    "stop",
]

#: The tracker stops after this long without a level-2 task in the process.
IDLE_SECONDS = 1.0
#: How often the watcher thread looks: reads a running task's records, or stops the tracker.
WATCH_SECONDS = 0.5
#: Without hole punching (a file system that cannot), a capture is replaced by a
#: new one between tasks once this much of it has been read.
ROTATE_BYTES = 32 << 20
#: Marker allocations are this size plus a multiple of 16 (see :meth:`Session.begin`).
MARKER_SIZE = 12_345
#: The watcher's markers (a size no task marker has).
DRAIN_MARKER_SIZE = MARKER_SIZE - 16
#: Forces a tracker around every task (memray's public API only), in every process.
PER_TASK_ENV = "TRACER_MEMRAY_PER_TASK"
#: The memray releases (major, minor) whose capture stream the C reader was
#: checked against, record by record, with memray's FileReader
#: (tests/ray/test_memory_reader.py). Any other release runs a tracker per task
#: (memray's public API), even when its header version is one the reader knows:
#: a record's encoding can change without the header's version changing.
KNOWN_MEMRAY = ((1, 20),)

_lock = threading.Lock()  # guards _session against the idle watcher
_session: Session | None = None
_disabled: str | None = None  # why this process cannot use a session (then: per task)
_atexit_registered = False


def disabled_reason() -> str | None:
    """Why level 2 runs a tracker per task in this process, or None if it need not."""
    # The one rule of tracer's switches (tracer._env): "false", "no", "off" turned it on.
    if env_flag(PER_TASK_ENV, False):
        return f"${PER_TASK_ENV} is on"
    return _disabled


def _check_reader() -> str | None:
    try:
        import tracer.ray._memray_reader  # noqa: F401
    except ImportError:
        return "tracer.ray._memray_reader (the C extension) is not built"
    return None


def _check_memray(version: str) -> str | None:
    """Why the reader must not follow this memray release's stream, or None (a known one)."""
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        major_minor = ()
    if major_minor in KNOWN_MEMRAY:
        return None
    known = ", ".join(f"{major}.{minor}" for major, minor in KNOWN_MEMRAY)
    return f"memray {version}: the live capture reader knows memray {known} only"


class Session:
    """The process's tracker, its capture and the reader following it.

    Methods are called under ``_lock``: by the measured task (``begin``,
    ``end``) and by the watcher thread (``drain``, while the task runs).
    """

    __slots__ = (
        "busy", "failed", "fd", "full", "last_used", "native_traces", "pid", "reader", "seq",
        "start", "tracker", "watcher", "window",
    )

    def __init__(self, tracker: Any, fd: int, reader: Reader, native_traces: bool) -> None:
        self.tracker = tracker
        self.fd = fd
        self.reader = reader
        self.native_traces = native_traces
        self.pid = os.getpid()
        self.busy = False  # a task is being measured
        self.start: tuple[int, int] | None = None  # its start marker (address, size)
        self.window = False  # the reader has passed it: the task's records are being read
        self.failed: str | None = None  # why the task's records could not be read
        self.last_used = time.monotonic()
        self.seq = 0
        self.full = False
        self.watcher: threading.Thread | None = None

    def begin(self) -> None:
        """Put a task's start marker in the stream."""
        import tracer.ray._memray_reader as _memray_reader

        self.seq += 1
        size = MARKER_SIZE + 16 * (self.seq % 61)
        self.start = (_memray_reader.marker_alloc(size), size)
        self.window = False
        self.failed = None
        self.busy = True

    def drain(self) -> None:
        """Read what the running task's allocations wrote so far, and release it.

        A task that allocates a lot for long would otherwise grow the capture
        (~4 bytes an allocation) until it ends. A marker of the watcher's own
        tells where the written records end; the reader's memory is invisible
        to memray, so nothing of this is added to the task's figures.
        """
        import tracer.ray._memray_reader as _memray_reader

        marker = _memray_reader.marker_alloc(DRAIN_MARKER_SIZE)
        try:
            self._to_start()
            if not self.reader.advance(marker, DRAIN_MARKER_SIZE):
                raise LookupError("a marker is not in the memray capture")
            self._release()
        finally:
            _memray_reader.marker_free(marker)

    def end(self) -> tuple[Window, int]:
        """Put the end marker in the stream and read the rest of the task's records.

        Returns the reader's window figures (see ``Reader.close_window``) and
        how many of its samples came before the peak (``Reader.peak_after``).
        Raises ``LookupError`` when a marker is not in the stream (the tracker
        stopped tracking: memray deactivates itself when it cannot write), and
        what the reader raises on a stream it does not understand.
        """
        import tracer.ray._memray_reader as _memray_reader

        start = self.start
        assert start is not None
        self.busy = False
        self.start = None
        end = _memray_reader.marker_alloc(start[1])
        try:
            if self.fd < 0:  # stopped meanwhile (the fd may be another file's by now)
                raise LookupError(self.failed or "the memray session was stopped")
            self._to_start(start)
            found = self.reader.advance(end, start[1])
            figures = self.reader.close_window()
            self.window = False
            if not found:
                raise LookupError("the task's end marker is not in the memray capture")
            self._release()
            return figures, self.reader.peak_after
        finally:
            _memray_reader.marker_free(end)
            _memray_reader.marker_free(start[0])

    def _to_start(self, start: tuple[int, int] | None = None) -> None:
        start = start or self.start
        if not self.window and start is not None:
            if not self.reader.advance(*start):
                raise LookupError("the task's start marker is not in the memray capture")
            self.reader.open_window()
            self.window = True

    def _release(self) -> None:
        if self.reader.release() < 0 and self.reader.offset > ROTATE_BYTES:
            self.full = True  # no holes here: start a new capture with the next task


def begin(native_traces: bool) -> Session | str:
    """Start measuring a task: the session (started if need be), its start marker put.

    Returns a reason string when no session can measure it (the caller marks
    the task unavailable); ``_tracker_lock`` of :mod:`tracer.ray.memory` is held.
    """
    global _session
    with _lock:
        session = _session
        if session is not None and (
            session.pid != os.getpid() or session.native_traces != native_traces or session.full
        ):
            if session.pid == os.getpid():
                _stop_locked(session)
            _session = session = None  # a forked child's copy is not ours to stop
        if session is None:
            started = _start_locked(native_traces)
            if isinstance(started, str):
                return started
            session = started
        try:
            session.begin()
        except Exception as exc:
            _stop_locked(session)
            return f"{type(exc).__name__}: {exc}"
        return session


def end(session: Session, metrics: dict[str, Any], all_allocations: bool) -> None:
    """Finish measuring a task begun with :func:`begin`: its figures into ``metrics``.

    Raises (with the reason) when the capture could not be read; the session
    is then dropped, and the next task starts a new one.
    """
    with _lock:
        session.last_used = time.monotonic()
        try:
            figures, peak_after = session.end()
        except Exception as exc:
            if _session is session:
                _stop_locked(session)
            raise RuntimeError(f"memray capture not read: {type(exc).__name__}: {exc}") from exc
    peak, at_peak, retained, total, count, samples = figures
    totals = (total, count) if all_allocations else None
    _memory.put_figures(metrics, peak, at_peak, retained, samples, totals, peak_after)


def stop() -> None:
    """Stop this process's tracker, if it has one (tracing is over)."""
    with _lock:
        if _session is not None and _session.pid == os.getpid():
            _stop_locked(_session)


def _start_locked(native_traces: bool) -> Session | str:
    global _session, _disabled, _atexit_registered
    try:
        import memray

        import tracer.ray._memray_reader as _memray_reader
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    unknown = _check_memray(str(getattr(memray, "__version__", "")))
    if unknown is not None:
        _disabled = unknown  # a tracker per task from now on (memray's public API)
        return unknown
    directory = _memory._capture_dir()
    if not _memory._swept:
        _memory._sweep(directory)
    path = os.path.join(
        directory, f"{_memory._CAPTURE_PREFIX}{os.getpid()}-{uuid.uuid4().hex}.bin"
    )
    fd = -1
    tracker = None
    try:
        tracker = memray.Tracker(
            destination=memray.FileDestination(path, overwrite=True, compress_on_exit=False),
            native_traces=native_traces,
            memory_interval_ms=_memory.SNAPSHOT_INTERVAL_MS,
            file_format=memray.FileFormat.ALL_ALLOCATIONS,
        )
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except Exception as exc:  # a tracker of someone else's, a full disk
        _close_fd(fd)
        return f"{type(exc).__name__}: {exc}"
    finally:
        _memory._remove(path)  # the capture lives on in the open file only
    try:
        tracker.__enter__()
    except Exception as exc:
        _close_fd(fd)
        return f"{type(exc).__name__}: {exc}"
    try:
        reader = _memray_reader.Reader(fd)
    except ValueError as exc:  # a memray whose stream this reader does not know
        _disabled = f"memray's capture is not readable live here ({exc})"
        _exit_tracker(tracker)
        _close_fd(fd)
        return _disabled
    except Exception as exc:
        _exit_tracker(tracker)
        _close_fd(fd)
        return f"{type(exc).__name__}: {exc}"
    session = _session = Session(tracker, fd, reader, native_traces)
    if not _atexit_registered:
        atexit.register(stop)
        _atexit_registered = True
    session.watcher = threading.Thread(
        target=_watch, args=(session,), name="tracer-memray-idle", daemon=True
    )
    session.watcher.start()
    return session


def _stop_locked(session: Session) -> None:
    global _session
    if _session is session:
        _session = None
    _exit_tracker(session.tracker)
    _close_fd(session.fd)
    session.fd = -1


def _exit_tracker(tracker: Any) -> None:
    with contextlib.suppress(Exception):
        tracker.__exit__(None, None, None)


def _close_fd(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def _forget_in_child() -> None:
    """After fork: the parent's tracker does not track the child (memray), and a
    lock held by one of the parent's threads would never be released here."""
    global _lock, _session
    _lock = threading.Lock()
    _session = None


os.register_at_fork(after_in_child=_forget_in_child)


def _watch(session: Session) -> None:
    """While the session lives: read a long task's records as they come (see
    :meth:`Session.drain`), and stop the session once no level-2 task has run
    for IDLE_SECONDS."""
    while True:
        time.sleep(WATCH_SECONDS)
        with _lock:
            if _session is not session:
                return
            if session.busy:
                if session.failed is None:
                    try:
                        session.drain()
                    except Exception as exc:
                        session.failed = f"{type(exc).__name__}: {exc}"
                        _stop_locked(session)
                        return
            elif time.monotonic() - session.last_used >= IDLE_SECONDS:
                _stop_locked(session)
                return


_disabled = _check_reader()

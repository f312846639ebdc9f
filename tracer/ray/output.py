"""Where traces go by default: the Ray session's log folder, or ``$TRACER_TRACE_DIR``.

The Ray dashboard's log view serves everything under a session's ``logs/``
folder, so a trace written to ``<session>/logs/tracer/`` can be fetched from
the dashboard of a remote cluster without shell access to the head node.

``$TRACER_TRACE_DIR`` moves that default elsewhere, for whoever needs every
trace of a process in one known folder without touching the code that runs
it (the ``tracer.testing`` pytest plugin does this for its measured blocks).
It changes the default only: a trace whose path is given explicitly
(``ray_tracer(path=...)``, ``Pipeline.run(trace_path=...)``) goes there.

Every run's trace is opened by :func:`open_trace`, which refuses (as an
error the callers turn into "running untraced") the paths no run can
write: anything but a regular file, and a file another run is writing.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import re
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

from tracer._env import warn_once
from tracer.errors import TraceWriteError
from tracer.format import TraceWriter

DEFAULT_SESSION_DIR = Path("/tmp/ray/session_latest")
#: Runs are recorded in microseconds. Nothing in a Ray run is finer: a
#: dispatch-loop phase takes microseconds, a task milliseconds, and Ray's own
#: timeline (``ray.timeline()``) is in microseconds. At that unit the
#: timestamp deltas, the one part of every packet that never repeats, take
#: fewer bits: a level-1 trace is ~14% smaller compressed (2000 no-op tasks:
#: 240 -> 207 B/task), and zlib has ~15% less to do. Callers still pass and read
#: nanoseconds (:class:`~tracer.format.TraceWriter`'s ``time_unit_ns``).
TIME_UNIT_NS = 1000
TRACE_SUFFIX = ".perfetto-trace"
#: Environment variable: the folder default trace paths go to, instead of the Ray session's.
TRACE_DIR_ENV_VAR = "TRACER_TRACE_DIR"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def ray_session_dir() -> Path:
    """The running Ray session's folder (``/tmp/ray/session_latest`` when unknown)."""
    try:
        import ray

        if ray.is_initialized():
            node = ray._private.worker.global_worker.node
            return Path(node.get_session_dir_path())
    except Exception:
        pass
    return DEFAULT_SESSION_DIR


def default_trace_dir() -> Path:
    """``$TRACER_TRACE_DIR`` when set (and not empty), else ``<Ray session>/logs/tracer``
    (``<temp dir>/tracer`` when Ray is not initialised).

    Never raises: every default path (the runner's, Ray Data's, Daft's log
    folder) comes from here, most of them outside the guard that turns a
    failure into "running untraced", and a ``~user`` that cannot be expanded
    (no such user, no home) raised there and killed the job. Such a value is
    warned about once and the Ray session's folder is used instead: the
    trace is still written, somewhere the warning names. (A folder that
    cannot be created is the caller's to report: that run goes untraced.)
    """
    override = os.environ.get(TRACE_DIR_ENV_VAR, "").strip()
    if override:
        try:
            return Path(override).expanduser()
        except Exception as exc:  # RuntimeError: "Could not determine home directory."
            fallback = ray_session_dir() / "logs" / "tracer"
            warn_once(
                f"tracer: cannot use ${TRACE_DIR_ENV_VAR}={override!r} "
                f"({type(exc).__name__}: {exc}); traces go to {fallback} instead"
            )
            return fallback
    if not _ray_initialized():
        # No session of this process's to write in: ``session_latest`` names the machine's
        # last session, most likely one that has ended, where nobody would look for it.
        return Path(tempfile.gettempdir()) / "tracer"
    return ray_session_dir() / "logs" / "tracer"


def _ray_initialized() -> bool:
    try:
        import ray

        return bool(ray.is_initialized())
    except Exception:
        return False


def default_trace_path(runner_name: str, execution_id: str) -> Path:
    """``<default_trace_dir()>/<runner>.<execution id>.<timestamp>.perfetto-trace``."""
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S.%f")
    name = f"{_safe(runner_name)}.{_safe(execution_id)}.{stamp}{TRACE_SUFFIX}"
    return default_trace_dir() / name


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text)[:80] or "_"


def open_trace(path: str | os.PathLike[str], *, compress: bool = True) -> TraceWriter:
    """The writer of one run's trace, in the Ray layer's time unit (:data:`TIME_UNIT_NS`).

    Raises :class:`~tracer.errors.TraceWriteError` for a path that is not a
    regular file (a FIFO blocked the open forever; a device or a socket is
    no trace either) and for one that another run, in this process or
    another, is writing: two runs given the same path would overwrite each
    other's trace, so the second is refused (its caller runs it untraced,
    with a warning naming the path) and the first keeps its trace. The claim
    is an exclusive ``flock`` on the file, held until the writer is closed
    (released by the system if the process dies); where the file system has
    no locks, the path is written unguarded, as before.
    """
    lock = _claim(Path(path))
    try:
        return _ClaimedTraceWriter(
            path, lock_fd=lock, compress=compress, time_unit_ns=TIME_UNIT_NS
        )
    except BaseException:
        if lock is not None:
            os.close(lock)
        raise


class _ClaimedTraceWriter(TraceWriter):
    """A run's writer: holds its file's claim (see :func:`_claim`) until it is closed."""

    def __init__(
        self, path: str | os.PathLike[str], *, lock_fd: int | None, **kwargs: Any
    ) -> None:
        self._lock_fd = lock_fd
        # The finishing thread and a failure's stop may both close the writer: the fd is
        # closed once (a second close could hit an fd reused meanwhile).
        self._lock_fd_lock = threading.Lock()
        super().__init__(path, **kwargs)

    def close(self) -> None:
        try:
            super().close()
        finally:
            with self._lock_fd_lock:
                fd, self._lock_fd = self._lock_fd, None
            if fd is not None:
                os.close(fd)


def _claim(path: Path) -> int | None:
    """Check that ``path`` can be a run's trace, and claim it; the claim's fd (None: unclaimed).

    The checks come before the writer's open, which would block on a FIFO
    and truncate a trace another run is writing. The claim's own open never
    blocks (``O_NONBLOCK``) and never truncates; if it fails, the writer's
    open reports why (a missing folder, a folder, permissions).
    """
    try:
        mode: int | None = os.stat(path).st_mode
    except OSError:
        mode = None  # not there yet (or not reachable: the writer's open says why)
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise TraceWriteError(f"cannot create trace file {path}: {_not_regular(mode)}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError:
        return None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # put there since the stat
            raise TraceWriteError(f"cannot create trace file {path}: {_not_regular(mode)}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TraceWriteError(
                f"cannot create trace file {path}: another run is writing it "
                "(the same trace path given to two runs at once)"
            ) from None
        except OSError:
            pass  # no locks on this file system: unguarded
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_regular(mode: int) -> str:
    kind = (
        "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
        else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file"
    )
    return f"it is {kind}, not a regular file"

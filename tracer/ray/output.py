"""Where traces go by default: the Ray session's log folder, or ``$TRACER_TRACE_DIR``.

The Ray dashboard's log view serves everything under a session's ``logs/``
folder, so a trace written to ``<session>/logs/tracer/`` can be fetched from
the dashboard of a remote cluster without shell access to the head node.

``$TRACER_TRACE_DIR`` moves that default elsewhere, for whoever needs every
trace of a process in one known folder without touching the code that runs
it (the ``tracer.testing`` pytest plugin does this for its measured blocks).
It changes the default only: a trace whose path is given explicitly
(``ray_tracer(path=...)``, ``Pipeline.run(trace_path=...)``) goes there.
"""

from __future__ import annotations

import datetime
import os
import re
from pathlib import Path

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
    """``$TRACER_TRACE_DIR`` when set (and not empty), else ``<Ray session>/logs/tracer``."""
    override = os.environ.get(TRACE_DIR_ENV_VAR, "").strip()
    if override:
        return Path(override).expanduser()
    return ray_session_dir() / "logs" / "tracer"


def default_trace_path(runner_name: str, execution_id: str) -> Path:
    """``<default_trace_dir()>/<runner>.<execution id>.<timestamp>.perfetto-trace``."""
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S.%f")
    name = f"{_safe(runner_name)}.{_safe(execution_id)}.{stamp}{TRACE_SUFFIX}"
    return default_trace_dir() / name


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text)[:80] or "_"


def open_trace(path: str | os.PathLike[str], *, compress: bool = True) -> TraceWriter:
    """The writer of one run's trace, in the Ray layer's time unit (:data:`TIME_UNIT_NS`)."""
    return TraceWriter(path, compress=compress, time_unit_ns=TIME_UNIT_NS)

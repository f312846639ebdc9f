"""Where traces go by default: the Ray session's log folder.

The Ray dashboard's log view serves everything under a session's ``logs/``
folder, so a trace written to ``<session>/logs/tracer/`` can be fetched from
the dashboard of a remote cluster without shell access to the head node.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

DEFAULT_SESSION_DIR = Path("/tmp/ray/session_latest")
TRACE_SUFFIX = ".perfetto-trace"
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
    return ray_session_dir() / "logs" / "tracer"


def default_trace_path(runner_name: str, execution_id: str) -> Path:
    """``<session>/logs/tracer/<runner>.<execution id>.<timestamp>.perfetto-trace``."""
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S.%f")
    name = f"{_safe(runner_name)}.{_safe(execution_id)}.{stamp}{TRACE_SUFFIX}"
    return default_trace_dir() / name


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text)[:80] or "_"

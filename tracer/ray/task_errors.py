"""What a failed task's Ray error tells the tracer.

A task's own exception arrives wrapped in ``RayTaskError``; Ray's system
errors (an OOM kill, a crashed worker, a lost node) are reports in text. The
tracer reads from them the root cause and a one-line message, whether it was
an OOM kill and how much memory the worker used then, the measurements a
traced task attached to its exception, and the node and worker it ran on.
Errors are told apart by class name, so this module needs no Ray import.
"""

from __future__ import annotations

import re

from tracer.ray import layout as L
from tracer.ray.task_metrics import Metrics

__all__ = [
    "error_args",
    "is_oom_kill",
    "memory_at_kill",
    "metrics_from_error",
    "root_cause",
    "where_from_error",
]


def root_cause(error: BaseException) -> BaseException:
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def error_args(error: BaseException) -> dict[str, str]:
    cause = root_cause(error)
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    # A task's own exception (RayTaskError) ends with "Type: message" after its
    # traceback; Ray's system errors (OOM kill, crashed worker) lead with the
    # summary, followed by details (the OOM killer's report runs to ~40 lines).
    message = lines[-1] if lines and cause is not error else " ".join(lines[:1])
    if is_oom_kill(error) and len(lines) > 1:
        reason = next((line for line in lines if line.startswith("OOM kill reason")), "")
        message = f"{message} {reason}".strip()
    return {
        L.ARG_ERROR_TYPE: type(cause).__name__ if cause is not error else type(error).__name__,
        L.ARG_ERROR: message[:500],
    }


def is_oom_kill(error: BaseException) -> bool:
    """Ray's ``OutOfMemoryError``, told by name so importing this module needs no Ray."""
    return any(cls.__name__ == "OutOfMemoryError" for cls in type(error).__mro__)

_KILL_MEMORY_RE = re.compile(r"actual memory used=([0-9.]+)\s*([KMGT]?B)")
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def memory_at_kill(error: BaseException) -> int | None:
    """The killed worker's memory use in Ray's OOM report (``actual memory used=0.89GB``)."""
    match = _KILL_MEMORY_RE.search(str(error))
    if match is None:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def metrics_from_error(error: BaseException) -> Metrics | None:
    for candidate in (error, getattr(error, "cause", None)):
        metrics = getattr(candidate, "__tracer_metrics__", None)
        if isinstance(metrics, dict):
            return metrics
    return None


_PID_RE = re.compile(r"pid=(\d+)")
_NODE_RE = re.compile(r"ID: ([0-9a-f]{16,})")


def where_from_error(error: BaseException) -> tuple[str | None, int]:
    """Node id and worker pid that Ray's error names (OOM kills and crashes say both)."""
    pid = getattr(error, "pid", None)
    text = str(error)
    if not isinstance(pid, int):
        match = _PID_RE.search(text)
        pid = int(match.group(1)) if match else 0
    node = _NODE_RE.search(text)
    return (node.group(1) if node else None), pid

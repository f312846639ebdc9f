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
from typing import Any

from tracer.ray import layout as L
from tracer.ray.task_metrics import Metrics

__all__ = [
    "CAUSE_LINE",
    "OOMError",
    "error_args",
    "exception_message",
    "exceptions_in_traceback",
    "is_oom_kill",
    "kill_args",
    "killed_workers",
    "memory_at_kill",
    "metrics_from_error",
    "oom_candidates",
    "raised_in_traceback",
    "root_cause",
    "top_memory_users",
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
    if cause is not error:
        # What the body raised, read where its traceback says it: the text's last line
        # may be a note added to it since (the reference runner names the stage and
        # partition in one), which said nothing of the error.
        raised = raised_in_traceback(str(error))
        if raised is not None:
            message = raised[1]
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

#: Ray 2.60 says ``actual memory used=0.89GB``, 2.50 ``memory used=0.94GB``.
_KILL_MEMORY_RE = re.compile(r"(?:actual )?memory used=([0-9.]+)\s*([KMGT]?B)")
#: One worker in an OOM report: its pid, then its memory. Ray 2.60 kills several workers
#: in one round and lists each, a task's worker or an actor's ("Selected to kill: (Task:
#: ..., pid=25292, actual memory used=0.50GB, ...)", "(Actor(03b7...): ..."), and every
#: task it killed gets that same report; Ray 2.50 names the one worker it killed.
_KILLED_RE = re.compile(r"pid=(\d+), (?:actual )?memory used=([0-9.]+)\s*([KMGT]?B)")
_SELECTED_RE = re.compile(
    r"Selected to kill: \((Task|Actor)\b[^\n]*?"
    r"(?:task name=([^\n]*?), (?=required resources=|pid=)[^\n]*?)?"
    r"pid=(\d+), (?:actual )?memory used=([0-9.]+)\s*([KMGT]?B)"
)
#: Ray's "GB" are GiB: one report reads "23.54GB limit" and "25276194816B limit" for the
#: same node. Two decimals: 0.50GB is 512 MiB +- 5 MiB.
_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


#: An error to read an OOM report from: Ray's ``OutOfMemoryError``, or the text of one (an
#: attempt's error in Ray's task events, which names its type apart). Any other: none.
OOMError = BaseException | str


def _oom_text(error: OOMError) -> str | None:
    if isinstance(error, str):
        return error
    return str(error) if is_oom_kill(error) else None


def _killed(error: OOMError) -> list[tuple[str, str, int, int]]:
    """(kind, Ray's task name, pid, bytes) of each worker Ray's OOM report names; kind
    "Task" or "Actor" and the name of what it ran (Ray 2.60), "" where the report does not
    say (Ray 2.50's)."""
    text = _oom_text(error)
    if text is None:
        return []
    selected = _SELECTED_RE.findall(text)
    if selected:
        return [(kind, name.strip(), int(pid), int(float(n) * _UNITS[u]))
                for kind, name, pid, n, u in selected]
    return [("", "", int(pid), int(float(n) * _UNITS[u]))
            for pid, n, u in _KILLED_RE.findall(text)]


def killed_workers(error: OOMError) -> dict[int, int]:
    """Every worker Ray's OOM report says it killed (actors' too): pid -> its memory use
    then, in bytes. Their processes are gone."""
    return {pid: used for _, _, pid, used in _killed(error)}


def oom_candidates(error: OOMError, task_name: str | None = None) -> dict[int, int]:
    """The killed workers that may have run the task: those running a task, where the
    report tells (an actor's worker runs no task of the runner's: Ray Data's stats
    actor, tracer's metrics actor), else all; of those, the ones running a Ray task
    named ``task_name`` when there are any (Ray Data's tasks and the reference runner's
    are named after their stage). One: it is the task's."""
    killed = _killed(error)
    tasks = {pid: used for kind, _, pid, used in killed if kind == "Task"}
    if task_name and tasks:
        named = {pid: used for kind, name, pid, used in killed
                 if kind == "Task" and name == task_name}
        if named:
            return named
    return tasks or {pid: used for _, _, pid, used in killed}


def kill_args(error: OOMError, task_name: str | None = None) -> dict[str, Any]:
    """A task's annotations from Ray's OOM report (none for another error): the memory
    its worker used at the kill, and the workers it may have run in when the report
    names several (``layout.ARG_OOM_KILLED_WORKERS``). What every producer writes on a
    killed task's slice and its mark. ``task_name``: the name Ray knows the task by,
    where the producer knows it (see :func:`oom_candidates`)."""
    args: dict[str, Any] = {}
    at_kill = memory_at_kill(error, task_name)
    if at_kill:
        args[L.ARG_MEMORY_AT_KILL] = at_kill
    candidates = oom_candidates(error, task_name)
    if len(candidates) > 1:  # which of them ran this task, Ray's report does not say
        args[L.ARG_OOM_KILLED_WORKERS] = {str(p): b for p, b in candidates.items()}
    return args


def memory_at_kill(error: OOMError, task_name: str | None = None) -> int | None:
    """The killed worker's memory use in Ray's OOM report (``actual memory used=0.89GB``).

    A report of several task workers killed at once names the Ray task each
    ran, not which of those tasks this one was (every task killed then gets
    the same text): the worker running a task of this one's name
    (``task_name``) where there is one; of several, the least of theirs,
    which the task's worker used at least, rather than the first worker's
    (half the tasks of a round got another worker's figure).
    """
    candidates = oom_candidates(error, task_name)
    if candidates:
        return min(candidates.values())
    match = _KILL_MEMORY_RE.search(error if isinstance(error, str) else str(error))
    if match is None:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2)])


#: Ray's OOM report ends with its node's largest processes: a header, then a line each.
_TOP_HEADER_RE = re.compile(r"Top \d+ memory users:\s*PID\s+MEM\(([KMGT]?B)\)[^\n]*\n")
_TOP_LINE_RE = re.compile(r"(\d+)\t([0-9.]+)\t([^\n]*)\n?")


def top_memory_users(error: OOMError) -> list[dict[str, Any]]:
    """The processes Ray's OOM report lists as its node's largest at the kill (Ray 2.50
    and 2.60 list the top 10): ``{"pid", "memory" (bytes), "command"}`` each, largest
    first; [] for another error. A Ray worker's command names what it ran
    (``ray::MapBatches(hog)``, ``ray::IDLE``)."""
    text = _oom_text(error)
    if text is None:
        return []
    header = _TOP_HEADER_RE.search(text)
    if header is None:
        return []
    unit = _UNITS[header.group(1)]
    users: list[dict[str, Any]] = []
    pos = header.end()
    while len(users) < 32:
        line = _TOP_LINE_RE.match(text, pos)
        if line is None:
            break
        users.append({"pid": int(line.group(1)), "memory": int(float(line.group(2)) * unit),
                      "command": line.group(3).strip()[:200]})
        pos = line.end()
    return users


def metrics_from_error(error: BaseException) -> Metrics | None:
    for candidate in (error, getattr(error, "cause", None)):
        metrics = getattr(candidate, "__tracer_metrics__", None)
        if isinstance(metrics, dict):
            return metrics
    return None


_PID_RE = re.compile(r"pid=(\d+)")
_NODE_RE = re.compile(r"ID: ([0-9a-f]{16,})")


def where_from_error(
    error: BaseException, task_name: str | None = None
) -> tuple[str | None, int]:
    """Node id and worker pid that Ray's error names (OOM kills and crashes say both).

    The pid is 0 (unknown) when an OOM report names several killed task
    workers that may have run this task (see :func:`oom_candidates`).
    """
    pid = getattr(error, "pid", None)
    text = str(error)
    if not isinstance(pid, int):
        candidates = oom_candidates(error, task_name)
        if candidates:
            pid = next(iter(candidates)) if len(candidates) == 1 else 0
        else:
            match = _PID_RE.search(text)
            pid = int(match.group(1)) if match else 0
    node = _NODE_RE.search(text)
    return (node.group(1) if node else None), pid


#: Between an exception and the one raised ``from`` it, in a traceback's text.
CAUSE_LINE = "The above exception was the direct cause of the following exception:"
#: Between an exception and one raised while handling it.
_CONTEXT_LINE = "During handling of the above exception, another exception occurred:"
_CHAIN_RE = re.compile(f"^(?:{re.escape(CAUSE_LINE)}|{re.escape(_CONTEXT_LINE)})$", re.M)
#: The line naming an exception, as tracebacks end: "ValueError: boom", "mymod.BadRecord: x",
#: or a class name alone (no message). Any class name: a task may raise anything.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)(?:: .*)?$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
#: The heads of a traceback's part: Python's, and Ray's (where the task ran).
_HEADERS = ("ray::", "Traceback (most recent call last)")
#: Lines of Ray's own before an exception's line: those, and the head of a failure's text
#: in Ray's task events.
_RAY_LINES = (*_HEADERS, "User exception:")
#: Ray's wrappers of the exception user code raised (Ray Data's UDFs): what one wraps
#: is what was raised.
_WRAPPERS = frozenset({"UserCodeException"})


def exceptions_in_traceback(text: str) -> list[tuple[str, str]]:
    """The exceptions of a traceback's text, innermost first: (class name, its line).

    Each exception's part of a chained traceback ends with its ``Type:
    message`` line: the first unindented line after the part's last frame,
    or after Ray's header (``ray::f() (pid=..)``) in a part without frames
    (source lines are indented; a message's later lines follow it). Colours
    are skipped. A part whose line cannot be told (cut short) is left out.
    """
    found: list[tuple[str, str]] = []
    for part in _CHAIN_RE.split(_ANSI_RE.sub("", text)):
        lines = part.splitlines()
        # After the last frame; in a part without frames (Ray Data leaves its own out),
        # after Ray's header (a part with neither was cut: its lines are anyone's).
        starts = [i for i, line in enumerate(lines) if line.startswith("  File ")] or [
            i for i, line in enumerate(lines) if line.startswith(_HEADERS)]
        if not starts:
            continue
        for line in lines[starts[-1] + 1:]:
            if not line.strip() or line[0].isspace() or line.startswith(_RAY_LINES):
                continue
            match = _EXCEPTION_LINE.match(line.rstrip())
            if match:
                found.append((match.group(1), line.strip()))
            break
    return found


def raised_in_traceback(text: str) -> tuple[str, str] | None:
    """The exception a task raised, from the text of its traceback: (class name, its line).

    Why: Ray's task events carry a failed task's error as text only, and
    it names Ray's error (``RayTaskError``) where the trace should name what
    the task raised, as its slice does. The last exception of the chain,
    unless it is Ray's wrapper of user code's: then what it wraps. None
    when the text names none (it was not a traceback, or was cut).
    """
    raised = exceptions_in_traceback(text)
    while len(raised) > 1 and raised[-1][0] in _WRAPPERS:
        raised.pop()
    return raised[-1] if raised else None


def exception_message(line: str, error_type: str) -> str:
    """The message of an exception's line (``mod.Type: message``), as a failed execution
    says it beside its ``error_type``; the line itself when it does not name that type."""
    head, sep, message = line.partition(": ")
    if head.rpartition(".")[2] == error_type:
        return message if sep else ""
    return line

"""Ray's ``TaskEvents`` as plain facts (:class:`~tracer.ray.timeline.RayTaskEvents`).

The one place that reads Ray's protobuf fields: :mod:`tracer.ray.ray_events`
decides what to read and from where, this turns what came back into what the
run timeline draws. It runs once per task sent, in the flusher's thread beside
the dispatch loop, so it is written for speed (see :func:`_fact`), and what
many tasks share (node ids, names, resources) is one object for all of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from tracer.ray import layout as L
from tracer.ray.ray_events_wire import is_raw, parse_entries, task_key
from tracer.ray.task_errors import (
    exception_message,
    killed_workers,
    memory_at_kill,
    raised_in_traceback,
    top_memory_users,
)
from tracer.ray.task_metrics import RAY_EVENT_NAME, unpack_rss
from tracer.ray.timeline import RayTaskEvents

__all__ = ["facts_of", "to_facts"]

_second = itemgetter(1)
#: Ray's profile events of a task's phases, and the names they get in the trace.
_PHASES = {
    "task:deserialize_arguments": L.PHASE_DESERIALIZE,
    "task:execute": L.PHASE_EXECUTE,
    "task:store_outputs": L.PHASE_STORE_OUTPUTS,
}
#: Ray's TaskStatus numbers of the states drawn, and their names.
_STATES = {
    1: L.STATE_PENDING_ARGS,
    2: L.STATE_PENDING_NODE,
    5: L.STATE_SUBMITTED,
    8: L.STATE_RUNNING,
    11: L.STATE_FINISHED,
    12: L.STATE_FAILED,
}


def to_facts(events: Iterable[Any], wanted: set[str] | None = None) -> list[RayTaskEvents]:
    """Ray's ``TaskEvents`` (protos, or entries of a reply not parsed yet) as facts;
    only those of ``wanted`` task ids, if given."""
    picked: list[tuple[Any, str]] = []
    for ev in events:
        task_id = task_key(ev)[0].hex()
        if wanted is None or task_id in wanted:
            picked.append((ev, task_id))
    return facts_of(picked)


def facts_of(picked: list[tuple[Any, str]]) -> list[RayTaskEvents]:
    """Facts of these events (with their hex task ids): entries not parsed yet are parsed
    here, a batch at a time, each dropped once it is a fact."""
    parsed = parse_entries([ev for ev, _ in picked if is_raw(ev)])
    return [
        _fact(next(parsed) if is_raw(ev) else ev, task_id)
        for ev, task_id in picked
    ]


#: What many tasks' facts have alike (node ids by their bytes, names, resources): one
#: object each instead of one per task, in facts held by the thousand until drawn.
_HEX: dict[bytes, str] = {}
_SHARED: dict[Any, Any] = {}
#: Either table is emptied past this many entries (a run of unique names, say).
_SHARED_MAX = 4096


def _shared(table: dict[Any, Any], key: Any, value: Any) -> Any:
    """``table``'s object for ``key``, ``value`` the first time."""
    found = table.get(key)
    if found is None:
        if len(table) >= _SHARED_MAX:
            table.clear()
        table[key] = found = value
    return found


def _fact(ev: Any, task_id: str) -> RayTaskEvents:
    # Read once per task sent, by the flusher thread beside the dispatch loop: the
    # protobuf's maps are iterated by key (their items() is Python's generic view,
    # ~4x slower), and each field is read once.
    updates = ev.state_updates
    ts_ns = updates.state_ts_ns
    states = sorted([(_STATES[k], ts_ns[k]) for k in ts_ns if k in _STATES], key=_second)
    span: tuple[int, int] | None = None
    measured: tuple[int, int] | None = None
    rss: tuple[int, int, int] | None = None
    reported_error: tuple[str, str] | None = None
    phases: list[tuple[str, int, int]] = []
    has_info = ev.HasField("task_info")
    info = ev.task_info
    name = info.name if has_info else ""
    for p in ev.profile_events.events:
        event_name = p.event_name
        phase = _PHASES.get(event_name)
        if phase is not None:
            phases.append((phase, p.start_time, p.end_time))
        elif event_name == RAY_EVENT_NAME:
            measured = (p.start_time, p.end_time)
            figures = unpack_rss(p.extra_data)
            if figures:
                rss = (figures["rss_start"], figures["rss_end"], figures["rss_peak"])
                if "error_type" in figures:
                    reported_error = (figures["error_type"], figures["error"][:500])
        elif event_name.startswith("task::"):
            span = (p.start_time, p.end_time)
            name = name or event_name[len("task::"):]
    phases.sort(key=_second)
    raw_node = updates.node_id or (info.node_id if has_info else b"")
    node_id = _HEX.get(raw_node)
    if node_id is None:
        node_id = _shared(_HEX, raw_node, raw_node.hex())
    error_type = error = ""
    failed_in_worker = False
    oom: tuple[int, tuple[tuple[int, int], ...], tuple[tuple[int, int, str], ...]] | None = None
    if updates.HasField("error_info"):
        error_type = _error_type(updates.error_info.error_type)
        failed_in_worker = error_type in _FAILED_IN_WORKER
        text = updates.error_info.error_message
        raised = raised_in_traceback(text) if error_type == "RayTaskError" else None
        if raised is not None:  # what the body raised: its class and message, as the
            # worker reports them (the task's slice, read on the driver, names it too)
            error_type, error = raised[0], exception_message(raised[1], raised[0])[:500]
        else:
            error = text[:500]
        if error_type == "OutOfMemoryError":
            oom = _oom_report(text, updates.worker_pid, name)
            error = _oom_message(text)
    if reported_error is not None:  # the body's own exception, as it reported it
        error_type, error = reported_error
    resources: tuple[tuple[str, float], ...] = ()
    if has_info:
        required = info.required_resources
        resources = tuple(sorted([(k, required[k]) for k in required]))
        resources = _shared(_SHARED, resources, resources)
    return RayTaskEvents(
        ray_task_id=task_id,
        attempt=ev.attempt_number,
        name=_shared(_SHARED, name, name),
        node_id=node_id,
        worker_pid=updates.worker_pid,
        states=tuple(states),
        span=span,
        phases=tuple(phases),
        measured=measured,
        rss=rss,
        error_type=error_type,
        error=error,
        resources=resources,
        failed_in_worker=failed_in_worker,
        oom_used=oom[0] if oom is not None else 0,
        oom_killed=oom[1] if oom is not None else (),
        oom_top=oom[2] if oom is not None else (),
    )


def _oom_message(text: str) -> str:
    """Ray's OOM report in a line, as the driver's error reads (``error_args``): its first
    line and its reason, not the object store's figures and the advice after them."""
    lines = [line for line in text.splitlines() if line.strip()]
    reason = next((line for line in lines if line.startswith("OOM kill reason")), "")
    return f"{lines[0] if lines else ''} {reason}".strip()[:500]


def _oom_report(
    text: str, worker_pid: int, name: str
) -> tuple[int, tuple[tuple[int, int], ...], tuple[tuple[int, int, str], ...]]:
    """What Ray's OOM report of an attempt says (see RayTaskEvents): the attempt's worker's
    memory at the kill (the worker Ray's events name, among those the report says it
    killed; else as :func:`~tracer.ray.task_errors.memory_at_kill` reads it), the workers
    killed, the node's largest processes."""
    killed = killed_workers(text)
    used = killed.get(worker_pid) or memory_at_kill(text, name or None) or 0
    top = tuple((int(u["pid"]), int(u["memory"]), str(u["command"]))
                for u in top_memory_users(text))
    return used, tuple(killed.items()), top


#: Ray's ErrorType names that have an exception class of their own, by that class's name:
#: what a failure read from the task's return value or error would have said.
_ERROR_CLASSES = {
    "TASK_CANCELLED": "TaskCancelledError",
    "OUT_OF_MEMORY": "OutOfMemoryError",
    "WORKER_DIED": "WorkerCrashedError",
    "NODE_DIED": "NodeDiedError",
    "TASK_EXECUTION_EXCEPTION": "RayTaskError",
}


#: Ray's errors (by the names above) of an attempt its worker ended itself: it reports
#: its own events of the attempt after the failure, worth waiting for.
_FAILED_IN_WORKER = frozenset({"RayTaskError", "TaskCancelledError"})


def _error_type(code: int) -> str:
    try:
        from ray.core.generated import common_pb2

        name = str(common_pb2.ErrorType.Name(code))
    except Exception:
        return f"ray error {code}"
    return _ERROR_CLASSES.get(name, name)

"""Task-side measurements: when and where a task ran, and what memory it used.

This code runs inside Ray workers. It measures a task's start and end with
the wall clock (the one clock all nodes share), where it ran (node, worker
process, Ray's task id and assigned resources) and its memory, and hands the
result to a *sink*:

* the **return channel** (the default, used by :class:`RayFunctionWrapper`):
  the measurements ride back as one extra, small return value of the task.
  Ray inlines small return values into the reply to the owner, so this costs
  the task no extra round trip. The driver picks them up when it receives the
  task as ready. They travel as ``bytes`` (:func:`pack_metrics`), not as the
  dict: Ray hands a ``bytes`` return through untouched, while a dict goes
  through its pickle path, and ``ray.get`` of a small dict cost the driver
  ~23 µs where the same measurements as marshal bytes cost ~8 µs plus ~1 µs
  to unpack (measured on 2000 inlined returns). The task is not sent the
  runner's task id (an argument costs both sides Ray's serialization): the
  driver knows whose return value it reads, and measurements are named by
  Ray's task id where that matters (inside another task's error).
* **Ray's own task events** (level 1 with ``TRACER_EXECUTIONS=ray_events``,
  :func:`run_reported_to_ray`): the task returns nothing of ours; it puts
  its RSS in one profile event of Ray's, and Ray's events bring the rest.
* the **actor channel** (:mod:`tracer.ray.metrics_actor`), for tasks that only wrap
  their body in :func:`collect_ray_task_metrics` (the Daft pattern): a
  fire-and-forget actor call costs the task ~150-300 µs here, and the driver
  drains the actor once per wave.

The return channel is the default: a task pays no call for it (one
fire-and-forget actor call per task costs about as much as the task itself),
its measurements arrive with the result and cannot be lost to a dead actor.
Batching the measurements to an actor from a worker thread was measured too
(benchmarks/README.md, ``bench_runner.py``): no cheaper than the second
return, and it needs a thread in every worker.

**Attempts.** Ray retries a task whose worker crashed (``max_retries``) or
that raised with ``retry_exceptions``, transparently: the driver only ever
sees the last attempt's return values. So every measurement carries Ray's
attempt number (``attempt``, 0 for the first), which tells the driver how
many earlier attempts it did not see. An attempt that raises can still
report itself: when the execution has a metrics actor
(``TaskContext.metrics_actor``), a traced task sends the measurements of an
attempt that failed to it (the failure path only; a successful attempt never
calls the actor). An attempt whose worker died (a crash, a killed worker, a
lost node) measures nothing anyone can receive: only its number is known.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import marshal
import os
import resource
import time
from collections.abc import Callable, Iterator
from typing import Any

from tracer.errors import InvalidTracingLevelError
from tracer.ray.levels import ENV_VAR, TracingLevel, resolve_level

Metrics = dict[str, Any]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

#: The metrics of the task being measured in this context, if any: a task that
#: is already measured (a traced call) is not measured again by
#: :func:`collect_ray_task_metrics` in its body.
_CURRENT: contextvars.ContextVar[Metrics | None] = contextvars.ContextVar(
    "tracer_task_metrics", default=None
)


@dataclasses.dataclass(frozen=True)
class TaskContext:
    """What a measured task knows about itself.

    A traced call (:class:`~tracer.ray.RayFunctionWrapper`) does not send it
    with every task: what is the same for every task of an execution (level,
    memray options, the metrics actor) is baked into the remote function the
    call submits, and the task runs with that template, whose ``task_id`` is
    empty: the driver knows which task's measurements it receives. Only with
    a metrics actor does the task id travel, as an argument, for the failed
    attempts that report through the actor (see ``tracer.ray.wrappers`` for
    what each argument costs).
    """

    execution_id: str
    task_id: str
    stage_id: int | None
    level: int
    memray_native_traces: bool = False
    #: The execution has a metrics actor: failed attempts report themselves to it.
    metrics_actor: bool = False
    #: Level 2 records every allocation (memray's ALL_ALLOCATIONS), for totals.
    memray_all_allocations: bool = False
    #: Level 1 reports through Ray's own task events (:func:`run_reported_to_ray`),
    #: not an extra return value.
    via_ray_events: bool = False

    def for_task(self, task_id: str) -> TaskContext:
        """This context for another task of the same execution (built in the worker)."""
        return dataclasses.replace(self, task_id=task_id, stage_id=None)


def current_rss() -> int:
    """This process's private resident memory in bytes: its RSS without shared pages.

    What tracer calls a worker's RSS (``rss_start``, ``rss_end``, ``rss_peak``):
    see :func:`rss_and_shared`.
    """
    return rss_and_shared()[0]


def rss_and_shared() -> tuple[int, int]:
    """This process's resident memory in bytes, split: (private, shared).

    One read of ``/proc/self/statm``: its ``resident`` minus its ``shared``
    (the resident pages that map a file or shared memory: Linux's RssFile and
    RssShmem), which leaves RssAnon, the process's own memory, as private.
    The shared part is what a Ray worker must not be charged for: the object
    store's pages it mapped (its tasks' return values written to plasma, the
    arguments it read zero-copy) stay in its RSS, so a worker's RSS grew with
    every task it ran (identical tasks returning ~200 MB each: RSS peaks of
    342, 575, 795, 1015 MiB in turn, RssAnon flat), and with the pages of
    the libraries it loaded (~65 MiB in a Ray worker). RSS minus shared is
    how Ray's docs define a worker's memory (the object store's memory
    is reported as shared with every worker: not subtracting it counts it
    twice), and close to the private memory Ray's OOM killer measures.

    The file stays open and is re-read from offset 0 (the kernel renders it
    afresh): ~0.8 µs, where opening it each time took ~4 µs, twice per task.
    A forked child opens its own (:func:`_forked`): the parent's descriptor
    reads the parent. On a failed read: the lifetime peak RSS, nothing shared.
    """
    global _STATM
    try:
        fd = _STATM
        if fd is None:
            _STATM = fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        fields = os.pread(fd, 64, 0).split()
        shared = int(fields[2]) * _PAGE
        return int(fields[1]) * _PAGE - shared, shared
    except (OSError, ValueError, IndexError):
        _STATM = None  # reopened next time (the descriptor may have been closed under us)
        return peak_rss(), 0


#: The descriptor of this process's open /proc/self/statm.
_STATM: int | None = None


def peak_rss() -> int:
    """This process's lifetime peak RSS in bytes, shared pages included (the kernel's
    high-water mark; :func:`_finish` takes them out).

    ``RUSAGE_THREAD`` rather than ``RUSAGE_SELF``: Linux reports the same
    peak for both (the process's memory high-water mark, its threads share
    it), but for ``RUSAGE_SELF`` it also sums the CPU times of every thread
    (a Ray worker has ~20): ~0.6 µs against ~1.1 in a Ray worker, twice per
    task. Where there is no ``RUSAGE_THREAD``, ``RUSAGE_SELF``.
    """
    return resource.getrusage(_RUSAGE_PEAK).ru_maxrss * 1024


_RUSAGE_PEAK = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


def reset_peak_rss() -> bool:
    """Set the kernel's high-water mark of this process's RSS back to its RSS now, so that
    :func:`peak_rss` after a task is that task's peak, not an earlier one's.

    Without it, a task's peak showed only where it rose above every earlier
    task's of the process: a worker that ran a 300 MiB task first had its next
    300 MiB tasks measured at their start and end (~100 MiB of Ray Data's
    short tasks). Writing ``5`` to ``/proc/self/clear_refs`` resets the mark
    (Linux 4.0+; the file stays open, one write a task, ~0.6 µs warm). Where it
    cannot be written (an older kernel, a locked-down /proc), never tried
    again: peaks are then lifetime marks, as before. False then.
    """
    global _CLEAR_REFS
    fd = _CLEAR_REFS
    if fd is False:
        return False
    try:
        if fd is None:
            _CLEAR_REFS = fd = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
        os.write(fd, b"5")
        return True
    except (OSError, TypeError):
        if isinstance(_CLEAR_REFS, int):
            with contextlib.suppress(OSError):
                os.close(_CLEAR_REFS)
        _CLEAR_REFS = False
        return False


#: The open /proc/self/clear_refs (None: not opened yet; False: not writable here).
_CLEAR_REFS: int | bool | None = None


def _forked() -> None:
    """In a forked child: its pid, its /proc file and its Ray are its own to find again.

    Every task reads them; asking ``os.getpid()`` each time to tell a child
    from its parent was a system call per read (four a task).
    """
    global _PID, _STATM, _PROCESS, _CLEAR_REFS
    _PID = os.getpid()
    _STATM = None  # the parent's descriptor reads the parent's RSS
    if _CLEAR_REFS is not False:
        _CLEAR_REFS = None  # and the parent's clear_refs resets the parent's mark
    _PROCESS = None


#: This process's pid (a forked child's own: :func:`_forked`).
_PID = os.getpid()
os.register_at_fork(after_in_child=_forked)


def _where() -> Metrics:
    """Where this task runs, from Ray (empty outside a Ray worker).

    ``ray_task_id`` is also what identifies the measurements: a traced call
    does not send the runner's task id to its task (the driver knows which
    task's return value it reads), so measurements that reach the driver
    inside another task's error (a failed input) are told apart by it.

    Every task runs this, between two of Ray's calls, on cold CPU caches: it
    asks Ray's core worker directly (three calls into C++), and converts the
    resources assigned (Ray's public ``get_assigned_resources`` is a page of
    Python) only when they differ from the previous task's in this process.
    Measured in a plain Ray loop: ~12 µs of a no-op task's time through the
    public runtime context, ~2 µs this way.
    """
    proc = _PROCESS
    if proc is None:  # first use (a forked child forgets its parent's: _forked)
        proc = _find_process_ray()
        if proc is None:
            return {}
    elif not proc.is_initialized():  # Ray was shut down in this process since
        return {}
    try:
        core = proc.core
        task_id = core.get_current_task_id()
        raw = core.resource_ids()
        if raw != proc.raw_resources:
            proc.assigned = dict(proc.context.get_assigned_resources())
            proc.raw_resources = raw
        where: Metrics = {
            "node_id": proc.node_id,
            "ray_task_id": None if task_id.is_nil() else task_id.hex(),
            "assigned_resources": dict(proc.assigned),
        }
        attempt = int(core.get_current_task_attempt_number())
    except Exception:  # a Ray whose core worker differs from 2.60's, or one shutting down
        return _where_public(proc)
    if attempt:
        where["attempt"] = attempt
    return where


def _where_public(proc: _ProcessRay) -> Metrics:
    """:func:`_where` through Ray's public runtime context: slower, and without the
    attempt number, which only the core worker has (Ray 2.60)."""
    try:
        context = proc.context
        return {
            "node_id": proc.node_id,
            "ray_task_id": context.get_task_id(),
            "assigned_resources": dict(context.get_assigned_resources()),
        }
    except Exception:  # Ray shutting down
        return {}


class _ProcessRay:
    """What every task of a worker process asks Ray, found once per process."""

    __slots__ = ("assigned", "context", "core", "is_initialized", "node_id", "raw_resources")

    def __init__(self, node_id: str, context: Any, core: Any, is_initialized: Any):
        self.node_id = node_id
        self.context = context
        self.core = core
        self.is_initialized = is_initialized
        self.raw_resources: Any = None  # Ray's resource ids of the last task
        self.assigned: dict[str, float] = {}  # and what they amount to


def _find_process_ray() -> _ProcessRay | None:
    """This process's Ray, if it is a Ray worker (a driver measures nothing of Ray's)."""
    global _PROCESS
    try:
        import ray
        from ray._private import worker as ray_worker

        if not ray.is_initialized():  # never start a Ray just to ask where we are
            return None
        if ray_worker.global_worker.mode != ray_worker.WORKER_MODE:
            return None
        context = ray.get_runtime_context()
        proc = _ProcessRay(
            context.get_node_id(), context, ray_worker.global_worker.core_worker,
            ray.is_initialized,
        )
    except Exception:
        return None
    _PROCESS = proc
    return proc


#: This process's Ray, once found (see :func:`_where`).
_PROCESS: _ProcessRay | None = None


#: Marks measurements packed by :func:`pack_metrics` (and the format's version).
_PACKED_MAGIC = b"TRM1"
#: marshal's format 4 reads the same on every Python since 3.4 (Ray's nodes
#: run one Python version anyway).
_MARSHAL_VERSION = 4


def pack_metrics(metrics: Metrics) -> bytes | Metrics:
    """The measurements as compact bytes for the return channel.

    marshal covers what measurements hold (str, int, float, bool, None and
    dicts, lists and tuples of them) at ~2 µs. A body that added anything
    else (``measure_task`` yields the dict to it) gets its dict sent as it
    is, which Ray pickles: slower, never lost.
    """
    try:
        return _PACKED_MAGIC + marshal.dumps(metrics, _MARSHAL_VERSION)
    except (ValueError, TypeError):
        return metrics


def unpack_metrics(value: Any) -> Metrics | None:
    """The measurements in a return-channel value (:func:`pack_metrics`), or None.

    None for anything that is not measurements (a task whose last return
    value was not ours, or bytes that do not decode): the task's execution is
    then missing from the trace, never the run's result.
    """
    if isinstance(value, bytes):
        if not value.startswith(_PACKED_MAGIC):
            return None
        try:
            metrics = marshal.loads(memoryview(value)[len(_PACKED_MAGIC):])
        except (ValueError, EOFError, TypeError):
            return None
        return metrics if isinstance(metrics, dict) else None
    return value if isinstance(value, dict) else None


@contextlib.contextmanager
def measure_task(
    ctx: TaskContext,
    sink: Callable[[Metrics], None] | None = None,
    *,
    failure_sink: Callable[[Metrics], None] | None = None,
) -> Iterator[Metrics]:
    """Measure the body as one task execution and give the result to ``sink``.

    The metrics dict is yielded so the body can add its own entries. On an
    exception the metrics are still completed, attached to the exception as
    ``__tracer_metrics__`` (it travels inside Ray's error to the driver) and
    given to the sink, or to ``failure_sink`` when there is no sink (a failed
    attempt Ray may retry, whose error the driver will never see); the
    exception propagates unchanged.
    """
    metrics, before = _start(ctx)
    memory = _memory_tracker(ctx, metrics)
    metrics["start_ns"] = time.time_ns()
    token = _CURRENT.set(metrics)
    try:
        with memory:
            yield metrics
    except BaseException as exc:
        _failed(metrics, before, exc)
        _deliver(sink if sink is not None else failure_sink, metrics)
        raise
    finally:
        _CURRENT.reset(token)
    _finish(metrics, before)
    _deliver(sink, metrics)


#: What :func:`_finish` needs of a task's start: the process's peak RSS (the
#: kernel's high-water mark, shared pages included) and its shared memory then.
_Before = tuple[int, int]


def _start(ctx: TaskContext) -> tuple[Metrics, _Before]:
    """The measurements at a task's start, and the process's peak RSS and shared
    memory before it (for :func:`_finish`).

    ``task_id`` is there only when the task knows it: a traced call leaves it
    (and the stage id) to the driver, which knows which task it submitted.
    """
    metrics = _where()
    metrics["pid"] = _PID
    if ctx.task_id:
        metrics["task_id"] = ctx.task_id
    if ctx.stage_id is not None:
        metrics["stage_id"] = ctx.stage_id
    reset_peak_rss()
    peak_before = peak_rss()
    metrics["rss_start"], shared = rss_and_shared()
    return metrics, (peak_before, shared)


def _failed(metrics: Metrics, before: _Before, exc: BaseException) -> None:
    """Complete the measurements of a body that raised, and attach them to its exception."""
    _finish(metrics, before)
    metrics["error_type"] = type(exc).__name__
    metrics["error"] = str(exc)[:500]
    with contextlib.suppress(Exception):
        exc.__tracer_metrics__ = metrics  # type: ignore[attr-defined]


def _finish(metrics: Metrics, before: _Before) -> None:
    """Complete a task's memory figures: ``rss_end``, ``rss_peak``, all without shared pages.

    ``rss_start`` and ``rss_end`` are read as such (:func:`rss_and_shared`).
    The peak cannot be: the kernel keeps one high-water mark of the whole RSS
    (``ru_maxrss``), shared pages included, and reading the private memory
    continuously would cost a thread. It is the process's lifetime mark:
    when it rose during the task, the task set it, at some moment when the
    RSS was ``private + shared`` then; otherwise the task's peak is taken as
    at least what was seen at its start and end (level 2 measures the real
    peak with memray). Shared memory changes little while a body runs (the
    object store's pages of its return value are mapped after the body
    returned, those of its arguments as it reads them): so the mark minus the
    larger of the shared memory at the start and at the end is the private
    memory at that moment, or less, whenever the shared memory only grew (or
    only shrank) during the task. Never more: an honest lower bound of the
    task's private peak, from the same reads per task as before. Without
    the subtraction, identical tasks of one worker had a peak growing by the
    return value's size per task (the object store's pages of the returns
    before); subtracting the shared memory at the start instead would
    overstate a task whose arguments' pages were mapped as it ran.

    The mark is reset at each task's start (:func:`reset_peak_rss`), so it is
    the task's own, even below an earlier task's. Two tasks running at once in
    one process (a threaded actor) reset it for each other: one may then be
    measured at its start and end only (a lower bound still).

    Level 2's memray snapshots (``rss_peak`` so far and ``memory_samples``)
    read the whole RSS too (memray's ``/proc/self/statm`` resident): they get
    the same shared memory taken out, so a worker's RSS counter (its task's
    start and end, memray's samples in between) is one quantity throughout.
    """
    peak_before, shared_start = before
    metrics.setdefault("end_ns", time.time_ns())
    rss_end, shared = rss_and_shared()
    metrics["rss_end"] = rss_end
    peak_after = peak_rss()
    if shared < shared_start:
        shared = shared_start
    peak = max(metrics["rss_start"], rss_end)
    if peak_after > peak_before:
        peak = max(peak, peak_after - shared)
    seen = metrics.get("rss_peak")
    if seen:  # level 2: memray's 10 ms snapshots, the whole RSS
        peak = max(peak, int(seen) - shared)
        samples = metrics.get("memory_samples")
        if samples:
            metrics["memory_samples"] = [(t, h, max(r - shared, 0)) for t, h, r in samples]
    metrics["rss_peak"] = peak


def _deliver(sink: Callable[[Metrics], None] | None, metrics: Metrics) -> None:
    if sink is None:
        return
    with contextlib.suppress(Exception):  # tracing never breaks the task
        sink(metrics)


def _memory_tracker(ctx: TaskContext, metrics: Metrics) -> contextlib.AbstractContextManager[Any]:
    if ctx.level >= TracingLevel.MEMORY:
        from tracer.ray.memory import track_task_memory

        return track_task_memory(
            metrics,
            native_traces=ctx.memray_native_traces,
            all_allocations=ctx.memray_all_allocations,
        )
    return contextlib.nullcontext()


@contextlib.contextmanager
def collect_ray_task_metrics(
    execution_id: str,
    task_id: str,
    stage_id: int | None = None,
    *,
    level: int | str | None = None,
) -> Iterator[Metrics | None]:
    """Record this task's execution for the runner tracer of ``execution_id``.

    For runners that call it inside their own remote functions (Daft's
    ``collect_ray_task_metrics``): the measurements go to the execution's
    metrics actor, which the driver drains every wave. ``level`` defaults to
    ``$TRACER_ENABLE_RAY_TRACING`` as seen by the worker; at 0 this does nothing.
    When neither is set, the task looks for the execution's metrics actor
    (once per worker process): if the driver started one, it traces the
    execution (its level given as an argument, which workers do not see), and
    the task is measured at level 1. Pass ``level=`` for level 2 there.
    Inside a task that is already measured (dispatched through
    :class:`~tracer.ray.RayFunctionWrapper`, as a Daft-style runner does) it
    yields that task's metrics and measures nothing twice.
    A ``$TRACER_ENABLE_RAY_TRACING`` the worker cannot read (``on``) means
    off, with one warning per worker: raising here failed every task of the
    job, whatever level the driver traced at (a bad ``level=`` still raises).
    """
    current = _CURRENT.get()
    if current is not None:
        yield current
        return
    try:
        lvl: TracingLevel | None = resolve_level(level)
    except InvalidTracingLevelError as exc:
        if level is not None:
            raise
        from tracer._env import warn_once

        warn_once(f"tracer: {exc}; this worker's tasks are not measured")
        lvl = None  # yielded outside the handler: the body's errors are not chained to it
    if lvl is None:
        yield None
        return
    if lvl == TracingLevel.OFF:
        from tracer.ray.metrics_actor import metrics_actor_exists

        if level is not None or ENV_VAR in os.environ or not metrics_actor_exists(execution_id):
            yield None
            return
        lvl = TracingLevel.TIMELINE
    from tracer.ray.metrics_actor import send_to_metrics_actor

    ctx = TaskContext(execution_id, task_id, stage_id, int(lvl))
    with measure_task(ctx, lambda m: send_to_metrics_actor(execution_id, m)) as metrics:
        yield metrics


#: The name of the profile event a task reports itself with to Ray (see run_reported_to_ray).
RAY_EVENT_NAME = "tracer:task"
_RAY_EVENT_NAME_BYTES = RAY_EVENT_NAME.encode("ascii")


def pack_rss(rss_start: int, rss_end: int, rss_peak: int) -> bytes:
    """A task's RSS figures as the ``extra_data`` of its profile event: a JSON object.

    Ray keeps ``extra_data`` as a string and passes it through untouched;
    ``ray.timeline()`` parses it as JSON (and shows it as the event's args),
    so it is one, written with ``%`` (~0.3 µs, where ``json.dumps`` costs ~3).
    """
    return b'{"rss_start":%d,"rss_end":%d,"rss_peak":%d}' % (rss_start, rss_end, rss_peak)


def pack_failure(metrics: Metrics) -> bytes:
    """A failed body's RSS figures and error, for its profile event (rare: json.dumps)."""
    keys = ("rss_start", "rss_end", "rss_peak", "error_type", "error")
    return json.dumps({k: metrics.get(k) for k in keys}).encode()


def unpack_rss(text: str) -> dict[str, Any]:
    """:func:`pack_rss`'s (or :func:`pack_failure`'s) figures; empty for anything else."""
    try:
        figures = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(figures, dict):
        return {}
    keys = ("rss_start", "rss_end", "rss_peak")
    if not all(type(figures.get(k)) is int for k in keys):
        return {}
    found: dict[str, Any] = {k: figures[k] for k in keys}
    if isinstance(figures.get("error_type"), str):
        found["error_type"] = figures["error_type"]
        found["error"] = str(figures.get("error") or "")
    return found


def _profile_event() -> Any:
    """A profile event of Ray's spanning this task's body, or None (not in a Ray worker).

    Ray times it from here until it is dropped and reports it with the
    task's own events (``task:execute`` ...), the way every worker reports
    them, about a second later: the driver reads the task's node, worker,
    attempt and this span from there, with no return value of ours.
    ``ray._private.profiling.profile`` would do the same, but does nothing
    unless ``RAY_PROFILING`` is set in the worker; the core worker's call is
    what it wraps (~1.3 µs).
    """
    proc = _PROCESS
    if proc is None:
        proc = _find_process_ray()
        if proc is None:
            return None
    try:
        return proc.core.profile_event(_RAY_EVENT_NAME_BYTES)
    except Exception:  # a Ray without it: the execution is then drawn from Ray's own span
        return None


def run_reported_to_ray(fn: Callable[..., Any], ctx: TaskContext, args: Any, kwargs: Any) -> Any:
    """Run ``fn`` at level 1, reporting its RSS in a profile event of Ray's; its result as is.

    What the return channel's measurements carried, Ray's task events carry
    already (node, worker, attempt, when it ran): only the RSS is added, as
    the ``extra_data`` of one profile event (:func:`_profile_event`). The
    task returns exactly what ``fn`` returns: Ray stores, tracks and delivers
    no extra value (on 2000 no-op tasks that value cost ~0.1x of the run's
    wall time, benchmarks/README.md). A body that raises still carries its
    measurements in its exception, as :func:`run_traced`'s does, for a runner
    that hands the error to ``task_failed``, and puts its error in the
    profile event (Ray records a task cancelled while it ran as finished).
    """
    event = _profile_event()
    reset_peak_rss()
    peak_before = peak_rss()
    rss_start, shared_start = rss_and_shared()
    before = (peak_before, shared_start)
    metrics: Metrics = {"rss_start": rss_start, "start_ns": time.time_ns()}
    token = _CURRENT.set(metrics)
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        metrics.update(_where(), pid=_PID)
        _failed(metrics, before, exc)
        if event is not None:
            with contextlib.suppress(Exception):
                event.set_extra_data(pack_failure(metrics))
            # Recorded now: the traceback keeps this frame (and so the event) alive.
            event = None
        raise
    finally:
        _CURRENT.reset(token)
    if event is not None:
        _finish(metrics, before)
        with contextlib.suppress(Exception):
            event.set_extra_data(
                pack_rss(metrics["rss_start"], metrics["rss_end"], metrics["rss_peak"])
            )
        del event  # Ray records the event now: its end is the body's end
    return result


def run_traced(
    fn: Callable[..., Any], ctx: TaskContext, num_returns: int, args: Any, kwargs: Any
) -> Any:
    """Run ``fn`` measured, returning its result(s) plus the metrics as a last value
    (packed: :func:`pack_metrics`).

    With a metrics actor, an attempt that raises also sends its measurements
    there: if Ray retries it, that is the only way the driver learns of it.
    Level 1 without one (the common case) is measured inline, without
    :func:`measure_task`'s generator: a task's every line runs on cold CPU
    caches, between two of Ray's, so what it does not run it does not pay for.
    """
    if ctx.metrics_actor or ctx.level >= TracingLevel.MEMORY:
        failure_sink: Callable[[Metrics], None] | None = None
        if ctx.metrics_actor:
            from tracer.ray.metrics_actor import send_to_metrics_actor

            failure_sink = functools.partial(send_to_metrics_actor, ctx.execution_id)
        with measure_task(ctx, failure_sink=failure_sink) as metrics:
            result = fn(*args, **kwargs)
    else:
        metrics, before = _start(ctx)
        metrics["start_ns"] = time.time_ns()
        token = _CURRENT.set(metrics)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _failed(metrics, before, exc)
            raise
        finally:
            _CURRENT.reset(token)
        _finish(metrics, before)
    packed = pack_metrics(metrics)
    if num_returns == 1:
        return result, packed
    return (*_returns(result, num_returns), packed)


def _returns(result: Any, num_returns: int) -> Any:
    """A multi-return task's values, checked as Ray checks them untraced, with Ray's own
    words: the measurements are one more value, and Ray's count would include them."""
    count = len(result)  # TypeError "object of type 'int' has no len()", as Ray's
    if count != num_returns:
        raise ValueError(f"Task returned {count} objects, but num_returns={num_returns}.")
    return result

"""The runner tracer: what a Ray runner's dispatch loop calls to be traced.

One :class:`RunnerTracer` traces one execution (one run of a dispatch loop)
into one trace file. It writes, through the format layer:

* a **Scheduler** process with a **Dispatch loop** thread: a slice per wave
  with nested plan polling, batching, dispatching and awaiting slices,
  instants for plan outcomes, and counters for tasks in flight and the
  cluster's available CPUs, GPUs and memory;
* **Ray tasks**: each task's life from created to received, with a nested
  dispatched-to-received slice, on a pool of lanes (tracks that trace_processor
  merges into one UI track), so thousands of overlapping tasks never break
  nesting;
* a process per **Ray node** with a thread per **worker**: a slice per task
  execution, measured inside the worker;
* **Stages**: a slice per stage from its first task's creation to its last
  task's completion, with flow arrows to every execution it launched.

The track and annotation names are in :mod:`tracer.ray.layout`.

**What can be known about failures.** A task that raised, was OOM-killed or
whose worker crashed is recorded as failed where it ran (from the
measurements its error carries, or the worker Ray's error names). Ray
retries crashed attempts (``max_retries``) and, with ``retry_exceptions``,
attempts that raised, transparently: only the last attempt's return reaches
the driver. Its measurements carry Ray's attempt number, so a retried task
says how many attempts it took (``ray_attempts``) and how many left no
measurement (``unmeasured_attempts``). An attempt that raised reports itself
through the metrics actor when the execution has one (failure path only);
a crashed attempt never can. A task the runner cancels
(:meth:`RunnerTracer.task_cancelled`, or a ``TaskCancelledError`` it
reports) is ``cancelled``, with an execution when it had started and its
measurements come back (a graceful cancel), else without one.

**Lost measurements.** Every wait on Ray has a timeout. Measurements that do
not arrive are recorded as lost (an instant per task, and a count on the
execution slice); a metrics actor that stops answering is called no more
after its first failure, and the tasks whose measurements it held or would
have received are recorded as lost.

Why it is built this way: the dispatch loop must stay fast, so every call
writes a few bytes and returns; task measurements arrive late (when a task is
received) and are written with their true timestamps, which the format layer
supports. Tracing never breaks the job: the first error writing the trace
logs one warning and turns the tracer into a no-op.

A :class:`~tracer.ray.null_tracer.NullRunnerTracer` with the same methods,
all doing nothing, is what runners get at level 0.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from tracer.errors import TraceWriteError
from tracer.format import TraceWriter, Track
from tracer.ray import layout as L
from tracer.ray.levels import TracingLevel
from tracer.ray.memory_trace import MemoryTrace
from tracer.ray.null_tracer import NullRunnerTracer
from tracer.ray.resources import ResourceRequest
from tracer.ray.task_errors import (
    error_args,
    memory_at_kill,
    metrics_from_error,
    root_cause,
    where_from_error,
)
from tracer.ray.task_metrics import Metrics, TaskContext, unpack_metrics

logger = logging.getLogger("tracer")

_F = TypeVar("_F", bound=Callable[..., Any])

# Synthetic pids/tids for nodes and workers: real worker pids repeat across
# the machines of a cluster, and trace_processor keys threads by tid.
_NODE_PID_BASE = 2_000_000_000
#: Linux pids (and the driver's own tids) are below 2**22: a worker's tid is its
#: pid in its node's own block of that size, so tids stay below 2**32 (a larger
#: one is truncated by trace_processor, which then shows a phantom thread).
_PID_SPACE = 1 << 22
_NODE_BLOCKS = (1 << 32) // _PID_SPACE - 1
_FLUSH_INTERVAL_S = 1.0
_MIN_FLUSH_GAP_S = 0.02
#: Memory counter samples (late by nature) are written out at most this often.
_SETTLE_INTERVAL_NS = 50_000_000
#: Received tasks are completed (measurements fetched in one ray.get) in
#: batches this big, or this often: a ray.get costs ~100 µs whatever its size.
_FETCH_BATCH = 64
_FETCH_INTERVAL_NS = 200_000_000
#: Timeouts of the tracer's waits on Ray. Measurements of received tasks are
#: small values already in the driver (~ms); one call of the metrics actor
#: is ~1 ms, and after its first failure the actor is not called again.
_METRICS_TIMEOUT_S = 10.0
_ACTOR_TIMEOUT_S = 5.0
#: How long the metrics actor may take to start (a new worker process, ~1-2 s;
#: the run does not wait for it, only the close does, for what it holds).
_ACTOR_START_TIMEOUT_S = 30.0
#: At close, how long to wait for measurements still on their way: through
#: the metrics actor (a task's fire-and-forget call may land after the runner
#: received its result), and of cancelled tasks.
_CLOSE_GRACE_S = 1.0
#: How long a failed task's measurements return is waited for, to be read
#: once (see RunnerTracer._drop_metrics_ref): it arrives with the task's result.
_DROP_WAIT_S = 0.5
#: Error types of a cancelled task (Ray's, and what a task sees inside).
_CANCEL_ERRORS = frozenset({"TaskCancelledError", "KeyboardInterrupt"})
#: Failed attempts remembered so that one reported twice (through the actor
#: and in its error) is written once.
_MAX_FAILED_ATTEMPTS = 100_000


def _guarded(method: _F) -> _F:
    """Run a tracer method; on any error, disable tracing once instead of failing the job.

    The calls a dispatch loop makes for every wave and task (loop slices,
    counters, marks, a task's dispatch) spell the same guard out inline: a
    wrapper is one more Python frame and an argument tuple per call, and
    between two of Ray's calls the loop runs on cold CPU caches, where each
    costs a few hundred ns more.
    """

    @functools.wraps(method)
    def wrapper(self: RunnerTracer, *args: Any, **kwargs: Any) -> Any:
        if self._disabled:
            return None
        try:
            with self._lock:
                return method(self, *args, **kwargs)
        except Exception as exc:
            self._disable(exc)
            return None

    return wrapper  # type: ignore[return-value]


def _guarded_failures(method: _F) -> _F:
    """:func:`_guarded` for the methods that report failures: they always return a dict.

    Once tracing has stopped (or if the method fails), they return the
    failures already found and not yet reported, never None: a runner that
    iterates over the result must not break because tracing did.
    """

    @functools.wraps(method)
    def wrapper(self: RunnerTracer, *args: Any, **kwargs: Any) -> Any:
        if not self._disabled:
            try:
                with self._lock:
                    return method(self, *args, **kwargs)
            except Exception as exc:
                self._disable(exc)
        with self._lock:
            return self._take_failures()

    return wrapper  # type: ignore[return-value]


class _TaskState:
    __slots__ = (
        "attempt",
        "dispatch_ts",
        "flow",
        "lane",
        "metrics",
        "metrics_ref",
        "received_ts",
        "released",
        "request",
        "stage_id",
        "task_id",
    )

    def __init__(
        self, task_id: str, stage_id: int, lane: Track, flow: int, request: ResourceRequest
    ) -> None:
        self.task_id = task_id
        self.stage_id = stage_id
        self.lane = lane
        self.flow = flow
        self.request = request
        self.dispatch_ts: int | None = None
        self.metrics_ref: Any = None
        self.metrics: Metrics | None = None  # fetched in a batch, not yet written
        self.received_ts = 0
        self.released = False
        self.attempt = 0


class _StageState:
    __slots__ = (
        "first_ts",
        "flows",
        "last_ts",
        "name",
        "outstanding",
        "over_request",
        "peaks",
        "requests",
        "stage_id",
        "tasks",
        "track",
        "written",
    )

    def __init__(self, stage_id: int, name: str, track: Track, ts: int) -> None:
        self.stage_id = stage_id
        self.name = name
        self.track = track
        self.first_ts = ts
        self.last_ts = ts
        self.flows: list[int] = []
        self.outstanding = 0
        self.tasks = 0
        self.requests: list[int] = []
        self.peaks: list[int] = []
        self.over_request = 0
        self.written = False


class _Worker:
    __slots__ = ("lanes", "last_end", "pid", "track")

    def __init__(self, track: Track, pid: int) -> None:
        self.track = track
        self.pid = pid
        self.last_end = 0
        self.lanes: list[tuple[Track, int]] = []


class _Node:
    __slots__ = ("index", "node_id", "track", "workers")

    def __init__(self, index: int, node_id: str, track: Track) -> None:
        self.index = index
        self.node_id = node_id
        self.track = track
        self.workers: dict[int, _Worker] = {}


class RunnerTracer:
    """Traces one execution of a Ray runner's dispatch loop into one trace file.

    Create it with :func:`tracer.ray.ray_tracer`; call its methods from the
    dispatch loop. The API follows Daft's RayRunner tracer call for call, so
    a runner instrumented for that ports by changing imports. Methods are
    thread-safe (one lock), but one tracer belongs to one dispatch loop.
    """

    enabled = True

    def __init__(
        self,
        writer: TraceWriter,
        *,
        execution_id: str,
        runner_name: str = "runner",
        level: TracingLevel = TracingLevel.TIMELINE,
        cluster_resources: dict[str, float] | None = None,
        metrics_actor: Any = None,
        memray_native_traces: bool = False,
        memray_all_allocations: bool = False,
    ) -> None:
        self.writer = writer
        self.execution_id = execution_id
        self.runner_name = runner_name
        self.level = level
        self.trace_path: Path = writer.path
        self.memray_native_traces = memray_native_traces
        self.memray_all_allocations = memray_all_allocations
        self._lock = threading.RLock()
        self._disabled = False  # no more tracing: after an error, or once closed
        self._failed = False  # tracing stopped after an error
        self._noop_open = 0  # no-op task slices open on the loop
        self._closed = False
        self._metrics_actor = metrics_actor
        # The actor's ``ready`` call until it answered: it may still be starting, and
        # the dispatch loop never waits for that (see _actor_is_ready).
        self._actor_ready_ref: Any = None
        self._actor_started_at = time.monotonic()
        if metrics_actor is not None:
            self._actor_ready_ref = metrics_actor.ready.remote()
        # The execution has (or had) a metrics actor; why it is gone, once it is.
        self._actor_channel = metrics_actor is not None
        self._actor_lost: str | None = None
        self._last_flush = time.monotonic()

        w = writer
        pid = os.getpid()
        self._scheduler = w.process_track(pid, f"{L.SCHEDULER_PROCESS} ({runner_name})", rank=0)
        self._loop = w.thread_track(pid, threading.get_native_id(), L.DISPATCH_LOOP_THREAD)
        self._inflight = w.counter_track(L.COUNTER_INFLIGHT, parent=self._scheduler)
        self._avail_cpus = w.counter_track(L.COUNTER_AVAILABLE_CPUS, parent=self._scheduler)
        self._avail_gpus = w.counter_track(L.COUNTER_AVAILABLE_GPUS, parent=self._scheduler)
        self._avail_mem = w.counter_track(
            L.COUNTER_AVAILABLE_MEMORY, parent=self._scheduler, unit="bytes"
        )
        self._tasks_root = w.track(L.TASKS_TRACK, rank=1)
        self._stages_root = w.track(L.STAGES_TRACK, rank=2, child_ordering="explicit")
        # Free lanes with the time they were released: a lane is reused only
        # by a task created after that, so its slices never overlap the last
        # ones, even when those end late (at their receipt time) in the file.
        self._free_lanes: list[tuple[Track, int]] = []
        self._wave_counts: dict[str, int] | None = None  # per-wave counts, inside a wave
        self._tasks: dict[str, _TaskState] = {}
        self._stages: dict[int, _StageState] = {}
        self._nodes: dict[str, _Node] = {}
        self._pending_metrics: list[_TaskState] = []
        # Received in batches, completed (measurements fetched, slices ended) in
        # bigger batches: one ray.get per _FETCH_BATCH tasks or _FETCH_INTERVAL_NS.
        self._received: list[_TaskState] = []
        self._completing: list[_TaskState] = []  # the batch _complete_received is writing
        # Failures found when completing received tasks, until a call returns them.
        self._unreported: dict[str, BaseException] = {}
        self._failures_seen: dict[int, str] = {}  # hash of an error's text -> its task
        # Failed tasks by Ray's task id: measurements in a downstream task's error name only it.
        self._failed_ray_tasks: dict[str, str] = {}
        self._last_fetch = 0
        # Tasks whose measurements may come through the metrics actor, by id (for their flow).
        self._actor_tasks: dict[str, _TaskState] = {}
        self._lost_measurements = 0
        # Failure paths only: (task id, Ray attempt) of the executions written
        # for failed attempts, and per task in flight how many were written.
        self._failed_attempts: set[tuple[str, int]] = set()
        self._measured_failures: dict[str, set[int]] = {}
        # Cancelled tasks whose measurements may still come back: (state, metrics ref);
        # and the marks of those that were running, held while the actor may still
        # bring their measurements (then their execution says it all).
        self._cancelled: list[tuple[_TaskState, Any]] = []
        self._cancelled_running: dict[str, tuple[Track, int, dict[str, Any]]] = {}
        # Cancelled tasks by id, for the execution the actor may still bring (its stage's
        # arrow and its request); bounded like the failures remembered.
        self._cancelled_tasks: dict[str, _TaskState] = {}
        self._memory = MemoryTrace(writer, level)
        self._template: TaskContext | None = None  # see task_template
        self._request_annotations: dict[int, tuple[ResourceRequest, dict[str, Any]]] = {}

        totals = cluster_resources or {}
        self._total_cpus = float(totals.get("CPU", 0.0))
        self._total_gpus = float(totals.get("GPU", 0.0))
        self._total_mem = float(totals.get("memory", 0.0))
        self._used_cpus = 0.0
        self._used_gpus = 0.0
        self._used_mem = 0.0

        w.begin(
            self._loop,
            L.SLICE_EXECUTION,
            category=L.CAT_SCHEDULER,
            args={
                "execution_id": execution_id,
                "runner": runner_name,
                "tracing_level": int(level),
            },
        )
        self._sample_resources()
        w.flush()
        self._stop_flusher = threading.Event()
        self._wave_ended = False  # set by the loop, read by the flusher: no lock, no syscall
        self._last_settle = 0
        self._flusher = threading.Thread(
            target=self._flush_periodically, name=f"tracer-flush-{execution_id}", daemon=True
        )
        self._flusher.start()

    def _flush_periodically(self) -> None:
        """Flush when a wave ends (at most every 20 ms), and at least every second.

        The file I/O happens here, not in the dispatch loop: in a Ray driver
        every system call is a chance for another thread to take the GIL, and
        the loop would pay for that at every wave.
        """
        # The loop only sets a flag when a wave ends (waking a thread would
        # cost it a system call per wave); the flusher looks every 20 ms and
        # writes what the waves since added in one go.
        while not self._stop_flusher.wait(_MIN_FLUSH_GAP_S):
            due = time.monotonic() - self._last_flush >= _FLUSH_INTERVAL_S
            if self._wave_ended or due:
                self._wave_ended = False
                self.flush()

    # ------------------------------------------------------------- failures

    def _disable(self, exc: BaseException) -> None:
        if self._disabled:
            return
        self._disabled = self._failed = True
        self._stop_flusher.set()
        logger.warning(
            "tracer: tracing stopped for execution %s after an error (%s: %s); "
            "the run continues untraced; the trace so far is in %s",
            self.execution_id,
            type(exc).__name__,
            exc,
            self.trace_path,
        )
        with contextlib.suppress(Exception):
            self.writer.close()

    @property
    def disabled(self) -> bool:
        """True once tracing stopped after an error."""
        return self._failed

    # ---------------------------------------------------------- dispatch loop

    def dispatch_wave(
        self, wave_num: int
    ) -> contextlib.AbstractContextManager[Callable[..., None]]:
        """A wave of the dispatch loop; yields ``update(**metrics)`` for the wave's args."""
        return _Wave(self, wave_num)

    def _begin_loop(self, name: str, args: dict[str, Any] | None = None) -> None:
        if self._disabled:
            return
        try:
            with self._lock:
                self.writer.begin(self._loop, name, category=L.CAT_SCHEDULER, args=args)
        except Exception as exc:
            self._disable(exc)

    def _end_loop(self, args: dict[str, Any] | None = None) -> None:
        if self._disabled:
            return
        try:
            with self._lock:
                self.writer.end(self._loop, args=args)
        except Exception as exc:
            self._disable(exc)

    @_guarded
    def _end_wave(self, metrics: dict[str, Any]) -> None:
        now = self.writer.now()
        if self._received and now - self._last_fetch >= _FETCH_INTERVAL_NS:
            self._complete_received()
            now = self.writer.now()
        if self._pending_metrics or self._metrics_actor is not None:
            self._drain_metrics()
        if self._cancelled:
            self._poll_cancelled(0)
        if now - self._last_settle >= _SETTLE_INTERVAL_NS:  # memory counters: late anyway
            self._last_settle = now
            self._memory.settle(self._memory_watermark())
        self.writer.end(self._loop, args=metrics or None)
        self._sample_resources()
        self._wave_ended = True  # the flusher thread writes it out within 20 ms

    def dispatch_batching(self) -> contextlib.AbstractContextManager[Callable[..., None]]:
        """Collecting tasks from the plan into a dispatch batch."""
        return _LoopSlice(self, L.SLICE_BATCHING, None)

    def dispatching(self) -> contextlib.AbstractContextManager[Callable[..., None]]:
        """Submitting the batch to Ray."""
        return _LoopSlice(self, L.SLICE_DISPATCHING, None)

    def awaiting(
        self, num_returns: int | None = None, timeout: float | None = None
    ) -> contextlib.AbstractContextManager[Callable[..., None]]:
        """Waiting on in-flight tasks (``ray.wait``); yields ``update(**args)`` (``num_ready``)."""
        args: dict[str, Any] = {}
        if num_returns is not None:
            args["num_returns"] = num_returns
        if timeout is not None:
            args["timeout_s"] = float(timeout)
        return _LoopSlice(self, L.SLICE_AWAITING, args)

    def get_next_physical_plan(self) -> contextlib.AbstractContextManager[Callable[..., None]]:
        """Polling the plan for its next item; yields ``update(**args)``."""
        return _LoopSlice(self, L.SLICE_PLAN_POLLING, None)

    plan_polling = get_next_physical_plan

    def _loop_instant(self, name: str, args: dict[str, Any] | None = None) -> None:
        if self._disabled:
            return
        try:
            with self._lock:
                self.writer.instant(self._loop, name, category=L.CAT_SCHEDULER, args=args)
        except Exception as exc:
            self._disable(exc)

    def mark_noop_task_start(self) -> None:
        """A task the runner completes without Ray (e.g. a no-op) starts."""
        self._noop_open += 1
        self._begin_loop(L.SLICE_NOOP_TASK)

    def mark_noop_task_end(self) -> None:
        """Its end; one without a start is ignored (it would end the loop's enclosing slice)."""
        if self._noop_open:
            self._noop_open -= 1
            self._end_loop()

    def mark_handle_none_task(self) -> None:
        """The plan had nothing ready: it needs in-flight tasks to finish first."""
        self._loop_instant(L.INSTANT_NOTHING_READY)

    def mark_handle_materialized_result(self) -> None:
        """The plan produced a materialised result."""
        self._loop_instant(L.INSTANT_MATERIALIZED)

    def mark_handle_task_add_to_batch(self) -> None:
        """The plan produced a task that joins the dispatch batch (counted per wave)."""
        self._count_or_mark(L.ARG_TASKS_ADDED, L.INSTANT_TASK_ADDED)

    def mark_dispatch_task(self) -> None:
        """A task was submitted (counted per wave)."""
        self._count_or_mark(L.ARG_TASKS_DISPATCHED, L.INSTANT_DISPATCH_TASK)

    def mark_dispatch_actor_task(self) -> None:
        """An actor task was submitted (counted per wave)."""
        self._count_or_mark(L.ARG_ACTOR_TASKS_DISPATCHED, L.INSTANT_DISPATCH_ACTOR_TASK)

    def _count_or_mark(self, counter: str, instant: str) -> None:
        """Inside a wave, count into the wave's args (an instant per task would cost
        ~17 bytes and a few µs each, for what the task slices already show);
        outside one, write an instant."""
        counts = self._wave_counts
        if counts is not None:
            counts[counter] = counts.get(counter, 0) + 1
        else:
            self._loop_instant(instant)

    def count_inflight_tasks(self, count: int) -> None:
        """Sample the number of tasks in flight."""
        if self._disabled:
            return
        try:
            with self._lock:
                self.writer.counter(self._inflight, count)
        except Exception as exc:
            self._disable(exc)

    def _sample_resources(self) -> None:
        w = self.writer
        if self._total_cpus:
            w.counter(self._avail_cpus, _num(self._total_cpus - self._used_cpus))
        if self._total_gpus:
            w.counter(self._avail_gpus, _num(self._total_gpus - self._used_gpus))
        if self._total_mem:
            w.counter(self._avail_mem, int(self._total_mem - self._used_mem))

    # ------------------------------------------------------------------ tasks

    @_guarded
    def task_created(
        self,
        task_id: str,
        stage_id: int,
        resource_request: ResourceRequest | Any,
        instructions: str | None = None,
        *,
        stage_name: str | None = None,
    ) -> None:
        """A task left the plan. ``resource_request`` has num_cpus, num_gpus, memory_bytes."""
        request = _as_request(resource_request)
        now = self.writer.now()
        stage = self._stages.get(stage_id)
        if stage is None:
            name = stage_name or instructions or f"stage {stage_id}"
            track = self.writer.track(
                f"{stage_id}: {name}", parent=self._stages_root, rank=len(self._stages),
                merge=False,
            )
            stage = self._stages[stage_id] = _StageState(stage_id, name, track, now)
        elif stage.written:  # a task after stage_done: the stage goes on, in a slice of its own
            stage = self._stages[stage_id] = _StageState(stage_id, stage.name, stage.track, now)
        stage.tasks += 1
        stage.outstanding += 1
        stage.requests.append(int(request.memory_bytes or 0))
        flow = self.writer.new_flow_id()
        stage.flows.append(flow)
        free = self._free_lanes
        lane = free.pop()[0] if free and free[-1][1] < now else self._new_lane()
        state = _TaskState(str(task_id), stage_id, lane, flow, request)
        old = self._tasks.get(state.task_id)
        if old is not None:  # a retry reuses the id: close the earlier attempt's slices
            state.attempt = old.attempt + 1
            self._finish_task(old, now, {L.ARG_STATUS: L.STATUS_SUPERSEDED})
        self._tasks[state.task_id] = state
        if self._actor_channel:  # even once the actor is gone: to count what is lost
            self._actor_tasks[state.task_id] = state
        args: dict[str, Any] = {
            L.ARG_TASK_ID: state.task_id,
            L.ARG_STAGE_ID: stage_id,
            L.ARG_STAGE: stage.name,
            L.ARG_RESOURCE_REQUEST: self._request_args(request),
        }
        if instructions:
            args[L.ARG_INSTRUCTIONS] = instructions
        if state.attempt:
            args[L.ARG_ATTEMPT] = state.attempt
        self.writer.begin(lane, stage.name, now, category=L.CAT_TASK, args=args)

    def _request_args(self, request: ResourceRequest) -> dict[str, int | float]:
        """``request.as_args()``, made once per request object (a stage's tasks share one)."""
        cached = self._request_annotations.get(id(request))
        if cached is not None and cached[0] is request:
            return cached[1]
        args = request.as_args()
        if len(self._request_annotations) >= 1024:
            self._request_annotations.clear()
        self._request_annotations[id(request)] = (request, args)
        return args

    def _new_lane(self) -> Track:
        return self.writer.track(L.TASK_LANE, parent=self._tasks_root)

    def task_dispatched(self, task_id: str) -> TaskContext | None:
        """The task was submitted to Ray; returns the context a traced task runs with."""
        state = self._dispatched(task_id)
        return None if state is None else self._task_context(state)

    def _dispatched(self, task_id: str) -> _TaskState | None:
        """Record the dispatch; the task's state if a traced call may measure it.

        What :class:`~tracer.ray.RayFunctionWrapper` calls: the context the
        task runs with is the execution's (:attr:`task_template`), the same
        for every task, so none is made per task.
        """
        if self._disabled:
            return None
        try:
            with self._lock:
                return self._record_dispatch(task_id)
        except Exception as exc:
            self._disable(exc)
            return None

    def _record_dispatch(self, task_id: str) -> _TaskState | None:
        state = self._tasks.get(task_id if task_id.__class__ is str else str(task_id))
        if state is None:
            return None
        if state.dispatch_ts is not None:
            # Recorded already (by the runner, then again by the wrapper that
            # submits it): the wrapper still gets the context, once.
            return state if state.metrics_ref is None else None
        now = self.writer.now()
        state.dispatch_ts = now
        self.writer.begin(state.lane, L.SLICE_DISPATCHED, now, category=L.CAT_TASK)
        req = state.request
        self._used_cpus += req.num_cpus or 0
        self._used_gpus += req.num_gpus or 0
        self._used_mem += req.memory_bytes or 0
        return state

    def _task_context(self, state: _TaskState) -> TaskContext:
        return TaskContext(
            self.execution_id, state.task_id, state.stage_id, int(self.level),
            self.memray_native_traces, self._metrics_actor is not None,
            self.memray_all_allocations,
        )

    @property
    def task_template(self) -> TaskContext:
        """The context every traced task of this execution runs with (its task id empty)."""
        template = self._template
        if template is None or template.metrics_actor != (self._metrics_actor is not None):
            template = self._template = TaskContext(
                self.execution_id, "", None, int(self.level), self.memray_native_traces,
                self._metrics_actor is not None, self.memray_all_allocations,
            )
        return template

    def register_metrics_ref(self, task_id: str, ref: Any) -> None:
        """Where the task's measurements will arrive (the return channel)."""
        if self._disabled:
            return
        try:
            with self._lock:
                state = self._tasks.get(task_id if task_id.__class__ is str else str(task_id))
                if state is not None:
                    state.metrics_ref = ref
                    if self._actor_channel:
                        self._actor_tasks.pop(state.task_id, None)
        except Exception as exc:
            self._disable(exc)

    def task_not_ready(self, task_id: str) -> None:
        """Daft compatibility: a waited-on task was not ready yet (not recorded)."""

    @_guarded
    def task_received_as_ready(self, task_id: str) -> None:
        """The runner saw the task's result as ready.

        Its measurements are fetched at the end of the wave. Runners that
        receive tasks in batches should prefer :meth:`tasks_received_as_ready`.
        """
        state = self._tasks.pop(str(task_id), None)
        if state is None:
            return
        self._finish_task(state, self.writer.now(), None)

    @_guarded_failures
    def tasks_received_as_ready(self, task_ids: Iterable[str]) -> dict[str, BaseException]:
        """A batch of tasks seen as ready (one ``ray.wait``'s worth); returns failures found.

        Their measurements come back with one ``ray.get`` for many tasks (Ray
        inlines these small values, so no data moves): every ``_FETCH_BATCH``
        received tasks or ``_FETCH_INTERVAL_NS``, whichever comes first, and
        at the end. That is when their slices are ended (at the time they were
        received) and their executions written; failed tasks (an exception,
        an OOM kill, a crashed worker) are recorded as by :meth:`task_failed`
        and returned, so the failures a call returns may be of tasks received
        by earlier calls.
        """
        now = self.writer.now()
        tasks = self._tasks
        received = self._received
        for task_id in task_ids:
            state = tasks.pop(str(task_id), None)
            if state is not None:
                state.received_ts = now
                self._release(state, now)  # its slices end at `now`, written later
                received.append(state)
        if len(received) >= _FETCH_BATCH or now - self._last_fetch >= _FETCH_INTERVAL_NS:
            self._complete_received()
        return self._take_failures()

    @_guarded_failures
    def complete_received(self) -> dict[str, BaseException]:
        """Complete every task received so far now; returns the failures found.

        For the end of a dispatch loop: :meth:`tasks_received_as_ready`
        completes received tasks in batches, so the last failures would
        otherwise be found only at :meth:`close`, after the runner finished.
        """
        self._complete_received()
        return self._take_failures()

    def _take_failures(self) -> dict[str, BaseException]:
        """The failures found since the last call (also those found at a wave's end)."""
        if not self._unreported:
            return {}  # a new dict each time: the caller may add to it
        failures, self._unreported = self._unreported, {}
        return failures

    def _release(self, state: _TaskState, now: int) -> None:
        """The task no longer holds its lane nor its share of the cluster's resources."""
        if state.released:
            return
        state.released = True
        self._free_lanes.append((state.lane, now))
        if state.dispatch_ts is not None:
            req = state.request
            self._used_cpus -= req.num_cpus or 0
            self._used_gpus -= req.num_gpus or 0
            self._used_mem -= req.memory_bytes or 0

    def _complete_received(self) -> None:
        """Fetch the measurements of received tasks, end their slices, write their executions.

        Failures found are kept for :meth:`_take_failures`."""
        states, self._received = self._received, []
        self._last_fetch = self.writer.now()
        if not states:
            return
        self._completing = states  # still findable by _measured_task while written
        fetch = [s for s in states if s.metrics_ref is not None and s.metrics is None]
        errors = self._fetch_metrics(fetch) if fetch else {}
        if self._metrics_actor is not None and (
            errors or any(s.metrics is not None and s.metrics.get("attempt") for s in fetch)
        ):
            # Retried or failed tasks: their earlier attempts may be in the actor (or queued
            # for it, if it is still starting: then this waits for it).
            self._drain_actor(wait=True)
        for state in states:
            error = errors.get(state.task_id)
            if error is None:
                self._finish_task(state, state.received_ts, None)
            else:
                self._record_failure(state.task_id, error, state.received_ts, state)
        self._completing = []
        self._unreported.update(errors)

    def _fetch_metrics(self, states: list[_TaskState]) -> dict[str, BaseException]:
        """One round trip for many measurements; sets ``state.metrics``, returns the errors."""
        import ray

        refs = [s.metrics_ref for s in states]
        values: list[Any]
        try:
            values = ray.get(refs, timeout=_METRICS_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            return {}  # left for the wave's drain
        except Exception:  # at least one failed: sort them out one by one (rare)
            values = _get_each(refs)
        errors: dict[str, BaseException] = {}
        for state, value in zip(states, values, strict=True):
            if isinstance(value, BaseException):
                errors[state.task_id] = value
            else:
                state.metrics = unpack_metrics(value)
        return errors

    def _finish_task(self, state: _TaskState, now: int, args: dict[str, Any] | None) -> None:
        if state.metrics is not None and state.metrics.get("attempt"):
            args = {**(args or {}), **self._attempt_args(state.task_id, state.metrics)}
        elif self._actor_channel and args is None and state.metrics_ref is None:
            self._actor_task_received(state)
        w = self.writer
        if state.dispatch_ts is not None:
            w.end(state.lane, now)
        w.end(state.lane, now, args=args)
        self._release(state, now)
        stage = self._stages.get(state.stage_id)
        if stage is not None:
            stage.outstanding -= 1
            stage.last_ts = max(stage.last_ts, now)
        if state.metrics is not None:
            metrics, state.metrics = state.metrics, None
            self._write_execution(metrics, state)
        elif state.metrics_ref is not None:
            self._pending_metrics.append(state)
            if len(self._pending_metrics) >= 512:
                self._drain_metrics()

    def _attempt_args(self, task_id: str, metrics: Metrics) -> dict[str, Any]:
        """A retried task's attempts: how many, and how many were never measured."""
        attempt = int(metrics.get("attempt") or 0)
        measured = self._measured_failures.pop(task_id, set())
        return {
            L.ARG_RAY_ATTEMPTS: attempt + 1,
            L.ARG_UNMEASURED_ATTEMPTS: attempt - sum(1 for a in measured if a < attempt),
        }

    def _actor_task_received(self, state: _TaskState) -> None:
        """A task measured through the actor was received: if the actor is gone, so are they."""
        if self._actor_lost is not None and (
            self._actor_tasks.pop(state.task_id, None) is not None
        ):
            self._lost(state.task_id, self._actor_lost)

    @_guarded
    def task_failed(self, task_id: str, error: BaseException) -> None:
        """The task's result is an error: end its slices with the error, mark where it ran."""
        self._record_failure(str(task_id), error, self.writer.now())

    @_guarded
    def task_cancelled(self, task_id: str) -> None:
        """The runner cancelled the task (``ray.cancel``): end its slices as cancelled.

        Its lane and resources are released at once. If it was running and
        stops gracefully, Ray's error names its worker, which gets a "task
        cancelled" mark a wave or two later (at close, after up to
        ``_CLOSE_GRACE_S``); with a metrics actor, which brings the cancelled
        attempt's measurements, its execution is written instead. A task
        cancelled before it started, or force-killed (``force=True``), has
        neither: Ray's error then says neither whether nor where it ran.
        Nothing here waits on Ray.
        """
        state = self._tasks.pop(str(task_id), None)
        if state is None:
            return  # unknown, or already received: cancelling it changed nothing
        self._actor_tasks.pop(state.task_id, None)
        if self._actor_channel:  # a running task's attempt may report through the actor
            if len(self._cancelled_tasks) >= _MAX_FAILED_ATTEMPTS:
                self._cancelled_tasks.clear()
            self._cancelled_tasks[state.task_id] = state
        self._measured_failures.pop(state.task_id, None)
        ref, state.metrics_ref = state.metrics_ref, None
        state.metrics = None
        self._finish_task(state, self.writer.now(), {L.ARG_STATUS: L.STATUS_CANCELLED})
        if ref is not None:
            self._cancelled.append((state, ref))

    def _poll_cancelled(self, timeout: float) -> None:
        """Write the executions of cancelled tasks whose outcome is known (wait ``timeout``)."""
        import ray

        pending, self._cancelled = self._cancelled, []
        refs = [ref for _, ref in pending]
        try:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        except Exception:
            return  # Ray cannot tell: nothing more will be known
        done = set(ready)
        for state, ref in pending:
            if ref not in done:
                if not timeout:
                    self._cancelled.append((state, ref))
                continue  # at close: still stopping; the task slice says it was cancelled
            try:
                metrics = unpack_metrics(ray.get(ref, timeout=_METRICS_TIMEOUT_S))
            except Exception as exc:
                metrics = metrics_from_error(exc)
                if metrics is None:
                    node_id, pid = where_from_error(exc)
                    if pid:  # it was running: mark the worker where it stopped
                        mark = (
                            self._located(node_id, pid), self.writer.now(),
                            {L.ARG_TASK_ID: state.task_id, **error_args(exc)},
                        )
                        if self._metrics_actor is not None:
                            self._cancelled_running[state.task_id] = mark
                        else:
                            self._mark_cancelled(*mark)
                    continue
                if not _measured_itself(metrics, state, ref):
                    continue  # never ran: these are an upstream task's
            if isinstance(metrics, dict):
                self._write_execution(metrics, state)

    def _record_failure(
        self, task_id: str, error: BaseException, now: int, state: _TaskState | None = None
    ) -> None:
        if state is None:
            state = self._tasks.pop(task_id, None)
        # Its measurements come in its error, or never: not through the actor.
        self._actor_tasks.pop(task_id, None)
        err: dict[str, Any] = dict(error_args(error))
        status = L.STATUS_CANCELLED if err[L.ARG_ERROR_TYPE] in _CANCEL_ERRORS else L.STATUS_FAILED
        metrics = metrics_from_error(error)
        # A task whose input is a failed task's result never runs: Ray hands it
        # the same error, which carries the upstream task's measurements, or
        # (an OOM kill, a crash, a lost node) wraps the upstream task's error
        # (RayTaskError) around the very same message. Record it as failed
        # upstream, with no execution and no mark on a worker. A task's own
        # system error is not wrapped: two tasks lost with the same node get
        # the same message, and neither is the other's upstream.
        cause = root_cause(error)
        text_key = hash(str(cause))
        upstream = self._failures_seen.get(text_key) if cause is not error else None
        if metrics is not None:
            own = (
                _measured_itself(metrics, state, state.metrics_ref)
                if state is not None
                else str(metrics.get("task_id", task_id)) == str(task_id)
            )
            upstream = None if own else self._measured_task(metrics)
        if upstream is not None and upstream != task_id:
            if state is not None:
                self._drop_metrics_ref(state)
                state.metrics = None
                self._finish_task(
                    state, now, {L.ARG_STATUS: L.STATUS_FAILED_UPSTREAM,
                                 L.ARG_UPSTREAM_TASK_ID: upstream, **err},
                )
            self._measured_failures.pop(task_id, None)
            return
        if len(self._failures_seen) < 10_000:
            self._failures_seen[text_key] = task_id
        if metrics is not None and metrics.get("ray_task_id") and (
            len(self._failed_ray_tasks) < 10_000
        ):
            self._failed_ray_tasks[str(metrics["ray_task_id"])] = str(task_id)
        where: dict[str, Any] = {}
        node_id, pid = (None, 0) if metrics is not None else where_from_error(error)
        if node_id:
            where[L.ARG_NODE_ID] = node_id
        if pid:
            where[L.ARG_WORKER_PID] = pid
        memory: dict[str, Any] = {}
        if state is not None:
            memory[L.ARG_MEMORY_REQUESTED] = int(state.request.memory_bytes or 0)
        at_kill = memory_at_kill(error)
        if at_kill:
            memory[L.ARG_MEMORY_AT_KILL] = at_kill
        attempts: dict[str, Any] = {}
        if metrics is not None and metrics.get("attempt"):
            attempts = self._attempt_args(task_id, metrics)
        if state is not None:
            self._drop_metrics_ref(state)
            state.metrics = None
            self._finish_task(
                state, now, {L.ARG_STATUS: status, **err, **where, **memory, **attempts}
            )
        self._measured_failures.pop(task_id, None)
        if metrics is not None:
            metrics.setdefault("error_type", err[L.ARG_ERROR_TYPE])
            metrics.setdefault("error", err[L.ARG_ERROR])
            if self._new_failed_attempt(task_id, metrics):
                self._write_execution(metrics, state)
            return
        track = self._located(node_id, pid) if node_id or pid else self._loop
        name = L.INSTANT_TASK_CANCELLED if status == L.STATUS_CANCELLED else L.INSTANT_TASK_FAILED
        self.writer.instant(
            track, name, now, category=L.CAT_EXECUTION,
            args={L.ARG_TASK_ID: str(task_id), **err, **memory},
        )

    @staticmethod
    def _drop_metrics_ref(state: _TaskState) -> None:
        """Forget a failed task's measurements return, read once it is there.

        It holds the task's error, like the result the runner already read:
        dropped unread, Ray logs it as an "Unhandled error" that the runner
        did handle. A task's return values come in one reply, but the driver
        stores them one by one: the runner may see the result's error a few
        µs before this one is there, so it is waited for, briefly
        (``_DROP_WAIT_S``). Not there by then (a task the runner reports
        failed while it still runs): left alone.
        """
        ref, state.metrics_ref = state.metrics_ref, None
        if ref is None:
            return
        import ray

        with contextlib.suppress(Exception):
            ray.get(ref, timeout=_DROP_WAIT_S)

    def _measured_task(self, metrics: Metrics) -> str:
        """The runner's id of the task that took ``metrics`` (found in another task's error).

        Self-measuring tasks name themselves; a traced call's measurements name
        only Ray's task id, which is looked up among the failed tasks and, for a
        failure received in the same batch or not yet, the tasks in flight.
        """
        if metrics.get("task_id") is not None:
            return str(metrics["task_id"])
        ray_id = str(metrics.get("ray_task_id") or "")
        known = self._failed_ray_tasks.get(ray_id)
        if known is not None:
            return known
        for state in (*self._tasks.values(), *self._received, *self._completing):
            if state.metrics_ref is not None and _ray_task_id(state.metrics_ref) == ray_id:
                return state.task_id
        return f"ray task {ray_id}" if ray_id else "?"

    def _new_failed_attempt(self, task_id: str, metrics: Metrics) -> bool:
        """Whether this failed attempt is seen for the first time (it may come twice:
        through the metrics actor and in the task's error)."""
        key = (task_id, int(metrics.get("attempt") or 0))
        if key in self._failed_attempts:
            return False
        if len(self._failed_attempts) >= _MAX_FAILED_ATTEMPTS:
            self._failed_attempts.clear()
        self._failed_attempts.add(key)
        return True

    @_guarded
    def stage_done(self, stage_id: int) -> None:
        """No more tasks will be created for the stage: write its slice and flows now.

        Called while some of its tasks are still in flight, it leaves the
        slice to the close, so that it still ends with the stage's last task.
        """
        stage = self._stages.get(stage_id)
        if stage is None:
            return
        if any(s.stage_id == stage_id for s in self._received):
            self._complete_received()
        if stage.outstanding:
            return
        if any(s.stage_id == stage_id for s in self._pending_metrics):
            self._drain_metrics()  # its memory summary needs their measurements
        self._write_stage(stage)

    # ---------------------------------------------------------- measurements

    def _drain_metrics(self) -> None:
        """Fetch measurements of received tasks (return channel) and of the actor channel."""
        self._drain_pending()
        self._drain_actor()

    def _drain_pending(self) -> None:
        """Measurements of received tasks that their batch could not fetch (return channel)."""
        pending, self._pending_metrics = self._pending_metrics, []
        if pending:
            import ray

            refs = [s.metrics_ref for s in pending]
            try:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_METRICS_TIMEOUT_S)
            except Exception:
                ready = []
            ready_set = set(ready)
            for state in pending:
                if state.metrics_ref not in ready_set:
                    self._lost(state.task_id, "measurements did not arrive in time")
                    continue
                try:
                    metrics = unpack_metrics(ray.get(state.metrics_ref, timeout=_METRICS_TIMEOUT_S))
                except Exception as exc:  # the task failed: its error carries them
                    metrics = metrics_from_error(exc)
                    if metrics is None:
                        self._lost(state.task_id, f"{type(exc).__name__}")
                        continue
                    if not _measured_itself(metrics, state, state.metrics_ref):
                        continue  # never ran: an upstream task failed (these are its measurements)
                if metrics is None:
                    self._lost(state.task_id, "measurements unreadable")
                    continue
                self._write_execution(metrics, state)

    def _actor_is_ready(self, wait: bool) -> bool:
        """Whether the metrics actor is up; ``wait`` for it (until its start timeout).

        False while it starts (it holds nothing then: tasks' calls queue in
        their workers) or when it failed to start (then it is gone).
        """
        ref = self._actor_ready_ref
        if ref is None:
            return True
        import ray

        timeout = (
            max(0.0, self._actor_started_at + _ACTOR_START_TIMEOUT_S - time.monotonic())
            if wait else 0.0
        )
        ready, _ = ray.wait([ref], timeout=timeout)
        if not ready:
            if wait or time.monotonic() - self._actor_started_at >= _ACTOR_START_TIMEOUT_S:
                self._actor_gone(
                    f"metrics actor did not start within {_ACTOR_START_TIMEOUT_S:g} s"
                )
            return False
        try:
            ray.get(ref, timeout=_ACTOR_TIMEOUT_S)
        except Exception as exc:
            self._actor_gone(f"metrics actor failed to start ({type(exc).__name__})")
            return False
        self._actor_ready_ref = None
        return True

    def _drain_actor(self, wait: bool = False) -> bool:
        """Write what the metrics actor holds; False if there is no actor (any more).

        While the actor starts there is nothing to drain: this returns at once
        unless ``wait`` (for reports known to be coming: a retried task's
        earlier attempts, the stragglers at close).
        """
        actor = self._metrics_actor
        if actor is None:
            return False
        if not self._actor_is_ready(wait):
            return self._metrics_actor is not None
        import ray

        try:
            items = ray.get(actor.drain.remote(), timeout=_ACTOR_TIMEOUT_S)
        except Exception as exc:
            self._actor_gone(f"metrics actor unreachable ({type(exc).__name__})")
            return False
        for metrics in items:
            if isinstance(metrics, dict):
                self._from_actor(metrics)
        return True

    def _mark_cancelled(self, track: Track, ts: int, args: dict[str, Any]) -> None:
        self.writer.instant(track, L.INSTANT_TASK_CANCELLED, ts, category=L.CAT_EXECUTION,
                            args=args)

    def _from_actor(self, metrics: Metrics) -> None:
        task_id = str(metrics.get("task_id"))
        self._cancelled_running.pop(task_id, None)
        cancelled = self._cancelled_tasks.pop(task_id, None)
        if cancelled is not None:  # it was running when cancelled: this is how it ended
            if self._new_failed_attempt(task_id, metrics):
                self._write_execution(metrics, cancelled)
            return
        if metrics.get("error_type"):
            if not self._new_failed_attempt(task_id, metrics):
                return  # already written from the task's error
            state = self._actor_tasks.get(task_id)
            if state is None or not state.released:
                # A failed attempt of a task still in flight: Ray may retry it.
                attempts = self._measured_failures.setdefault(task_id, set())
                attempts.add(int(metrics.get("attempt") or 0))
                self._write_execution(metrics, self._tasks.get(task_id))
                return
        self._write_execution(metrics, self._actor_tasks.pop(task_id, None))

    def _actor_gone(self, reason: str) -> None:
        """The metrics actor failed: never call it again; what it held is lost."""
        self._metrics_actor = None
        self._actor_lost = reason
        logger.warning(
            "tracer: %s for execution %s; measurements of tasks reporting through it are "
            "lost (recorded in the trace); the run and the rest of its trace go on",
            reason, self.execution_id,
        )
        self.writer.instant(
            self._loop, L.INSTANT_METRICS_ACTOR_LOST, category=L.CAT_SCHEDULER,
            args={L.ARG_REASON: reason},
        )
        for task_id, state in list(self._actor_tasks.items()):
            if state.released:  # received: its measurements were in the actor, or on their way
                del self._actor_tasks[task_id]
                self._lost(task_id, reason)
        for mark in self._cancelled_running.values():
            self._mark_cancelled(*mark)
        self._cancelled_running.clear()

    def _await_actor_stragglers(self) -> None:
        """At close: measurements of received tasks may still be on their way to the actor."""

        def awaited() -> bool:
            return bool(self._cancelled_running) or any(
                s.released for s in self._actor_tasks.values()
            )

        if awaited():
            self._drain_actor(wait=True)  # it may still be starting: what it will hold counts
        deadline = time.monotonic() + _CLOSE_GRACE_S
        while awaited():
            if time.monotonic() >= deadline or not self._drain_actor():
                break
            time.sleep(0.02)
        for task_id, state in list(self._actor_tasks.items()):
            if state.released:
                self._lost(
                    task_id, self._actor_lost or "measurements did not arrive before the close"
                )
        self._actor_tasks.clear()
        for mark in self._cancelled_running.values():  # the actor did not bring these
            self._mark_cancelled(*mark)
        self._cancelled_running.clear()

    def _lost(self, task_id: str, why: str) -> None:
        self._lost_measurements += 1
        self.writer.instant(
            self._loop, L.INSTANT_METRICS_LOST, category=L.CAT_SCHEDULER,
            args={L.ARG_TASK_ID: task_id, L.ARG_REASON: why},
        )

    def _node(self, node_id: str) -> _Node:
        node = self._nodes.get(node_id)
        if node is None:
            index = len(self._nodes)
            label = node_id[:8] if node_id else "unknown"
            track = self.writer.process_track(
                _NODE_PID_BASE + index, f"{L.NODE_PROCESS_PREFIX} {index} ({label})",
                rank=1 + index,
            )
            node = self._nodes[node_id] = _Node(index, node_id, track)
        return node

    def _worker(self, node: _Node, pid: int) -> _Worker:
        worker = node.workers.get(pid)
        if worker is None:
            tid = (node.index % _NODE_BLOCKS + 1) * _PID_SPACE + pid % _PID_SPACE
            track = self.writer.thread_track(
                _NODE_PID_BASE + node.index, tid, f"{L.WORKER_THREAD_PREFIX} {pid}"
            )
            worker = node.workers[pid] = _Worker(track, pid)
        return worker

    def _located(self, node_id: str | None, pid: int) -> Track:
        """The track of the worker (or node) an error names; an error that names only
        the worker's pid (a cancelled task's) is placed on the node that worker is known on."""
        if node_id is None and pid:
            known = [n for n in self._nodes.values() if pid in n.workers]
            if len(known) == 1:
                return known[0].workers[pid].track
        node = self._node(node_id or "unknown")
        return self._worker(node, pid).track if pid else node.track

    def _execution_track(self, worker: _Worker, start: int, end: int) -> Track:
        """The worker's track, or a lane under it when executions overlap (threaded actors)."""
        if start >= worker.last_end:
            worker.last_end = end
            return worker.track
        for i, (lane, lane_end) in enumerate(worker.lanes):
            if start >= lane_end:
                worker.lanes[i] = (lane, end)
                return lane
        lane = self.writer.track(f"{L.WORKER_THREAD_PREFIX} {worker.pid}", parent=worker.track)
        worker.lanes.append((lane, end))
        return lane

    def _write_execution(self, m: Metrics, state: _TaskState | None) -> None:
        """One execution on its worker's track; the first of a task takes the stage's flow."""
        start = int(m.get("start_ns") or 0)
        end = int(m.get("end_ns") or start)
        if not start:
            return
        # A traced call's measurements do not name their task: the driver knows it.
        stage_id: Any
        if state is not None:
            task_id, stage_id = state.task_id, state.stage_id
        else:
            task_id, stage_id = str(m.get("task_id", "?")), m.get("stage_id")
        stage = self._stages.get(stage_id) if stage_id is not None else None
        node = self._node(str(m.get("node_id") or "unknown"))
        worker = self._worker(node, int(m.get("pid") or 0) or 1)
        track = self._execution_track(worker, start, end)
        args: dict[str, Any] = {L.ARG_TASK_ID: task_id}
        if m.get("ray_task_id"):
            args[L.ARG_RAY_TASK_ID] = m["ray_task_id"]
        if m.get("assigned_resources"):
            args[L.ARG_ASSIGNED_RESOURCES] = {
                k: _num(v) for k, v in m["assigned_resources"].items()
            }
        if m.get("attempt"):
            args[L.ARG_RAY_ATTEMPT] = int(m["attempt"])
        args.update(self._memory_args(m, state, stage, node.track, worker.track, start, end))
        error_type = m.get("error_type")
        cancelled = error_type in _CANCEL_ERRORS
        if error_type:
            args[L.ARG_STATUS] = L.STATUS_CANCELLED if cancelled else L.STATUS_FAILED
            args[L.ARG_ERROR_TYPE] = error_type
            args[L.ARG_ERROR] = m.get("error", "")
        flows = None
        if state is not None and state.flow:
            flows = [state.flow]
            state.flow = 0  # a retried task's later attempts: no second arrow
        name = stage.name if stage is not None else "task"
        self.writer.begin(
            track, name, start, category=L.CAT_EXECUTION, args=args, terminating_flows=flows
        )
        self.writer.end(track, end)
        if error_type:
            self.writer.instant(
                track, L.INSTANT_TASK_CANCELLED if cancelled else L.INSTANT_TASK_FAILED, end,
                category=L.CAT_EXECUTION,
                args={L.ARG_TASK_ID: task_id, L.ARG_ERROR_TYPE: error_type},
            )

    def _memory_args(
        self,
        m: Metrics,
        state: _TaskState | None,
        stage: _StageState | None,
        node: Track,
        worker: Track,
        start: int,
        end: int,
    ) -> dict[str, Any]:
        """Requested vs actual memory of one execution; queues its memory counter samples."""
        requested = int(state.request.memory_bytes or 0) if state is not None else None
        args, peak, over = self._memory.execution(m, requested, node, worker, start, end)
        if stage is not None and peak is not None:
            stage.peaks.append(peak)
            stage.over_request += over
        return args

    def _memory_watermark(self) -> int:
        """No execution still to come can start before this: the earliest dispatch in flight."""
        now = self.writer.now()
        dispatched = [s.dispatch_ts for s in self._tasks.values() if s.dispatch_ts is not None]
        dispatched.extend(s.dispatch_ts for s in self._pending_metrics if s.dispatch_ts)
        dispatched.extend(s.dispatch_ts for s in self._received if s.dispatch_ts)
        dispatched.extend(s.dispatch_ts for s, _ in self._cancelled if s.dispatch_ts)
        return min(dispatched, default=now)

    # ----------------------------------------------------------------- stages

    def _write_stage(self, stage: _StageState) -> None:
        if stage.written:
            return
        stage.written = True
        args: dict[str, Any] = {L.ARG_STAGE_ID: stage.stage_id, "num_tasks": stage.tasks}
        if stage.requests:
            args["memory_requested"] = _summary(stage.requests)
        if stage.peaks:
            args[L.ARG_MEMORY_PEAK] = _summary(stage.peaks)
            args[L.ARG_TASKS_OVER_REQUEST] = stage.over_request
        self.writer.begin(
            stage.track, stage.name, stage.first_ts, category=L.CAT_STAGE, args=args,
            flows=stage.flows,
        )
        self.writer.end(stage.track, max(stage.last_ts, stage.first_ts))
        stage.flows = []

    # -------------------------------------------------------------- lifecycle

    def flush(self) -> None:
        """Write everything buffered to the file; stop tracing if the file was removed.

        Safe from any thread: the events are taken under the tracer's lock,
        the disk is written outside it, so the dispatch loop never waits for
        the disk (in a Ray driver, any system call may also cost a GIL
        hand-over).
        """
        if self._disabled or self._closed:
            return
        try:
            with self._lock:
                if self._disabled or self._closed:
                    return
                self.writer.detach()
            self.writer.write_detached()
            self._last_flush = time.monotonic()
            # On Linux, writes to a removed file succeed and vanish: check it is there.
            if self.writer.file_removed():
                raise TraceWriteError(
                    f"trace file {self.trace_path} was removed while being written"
                )
        except Exception as exc:
            with self._lock:
                self._disable(exc)

    def close(self, error: BaseException | None = None) -> None:
        """Finish the trace: fetch outstanding measurements, write stages, close the file."""
        if self._closed:
            return
        self._stop_flusher.set()
        if self._flusher is not threading.current_thread():
            self._flusher.join(timeout=5.0)
        self._close(error)
        self._closed = True
        if not self._disabled:
            self._disabled = True  # later calls do nothing, quietly: the trace is finished
            with contextlib.suppress(Exception):
                self.writer.close()

    @_guarded
    def _close(self, error: BaseException | None) -> None:
        self._complete_received()
        self._drain_metrics()
        if self._cancelled:
            self._poll_cancelled(_CLOSE_GRACE_S)
        now = self.writer.now()
        for state in list(self._tasks.values()):
            # Never received: unfinished, its measurements not lost but not yet there.
            self._actor_tasks.pop(state.task_id, None)
            state.metrics_ref = None
            self._finish_task(state, now, {L.ARG_STATUS: L.STATUS_UNFINISHED})
        self._tasks.clear()
        if self._actor_channel:
            self._await_actor_stragglers()
        for state in self._pending_metrics:  # left by a timeout: never arrived
            self._lost(state.task_id, "measurements did not arrive before the close")
        self._pending_metrics.clear()
        self._cancelled.clear()
        self._cancelled_tasks.clear()
        self._measured_failures.clear()
        self._unreported.clear()
        for stage in self._stages.values():
            self._write_stage(stage)
        self._memory.settle(None)
        args: dict[str, Any] = {L.ARG_LOST_MEASUREMENTS: self._lost_measurements}
        if error is not None:
            args.update(error_args(error))
        self.writer.end(self._loop, args=args)


class _LoopSlice:
    """A dispatch-loop slice as a ``with`` block; yields ``update(**args)`` for its end.

    A small class rather than ``contextlib.contextmanager``: a generator-based
    context manager costs ~1.5 µs a block, and the loop opens about six a wave.
    """

    __slots__ = ("_args", "_end_args", "_name", "_tracer")

    def __init__(self, tracer: RunnerTracer, name: str, args: dict[str, Any] | None) -> None:
        self._tracer = tracer
        self._name = name
        self._args = args
        self._end_args: dict[str, Any] = {}

    def __enter__(self) -> Callable[..., None]:
        self._tracer._begin_loop(self._name, self._args)
        return self._end_args.update

    def __exit__(self, *exc: object) -> None:
        self._tracer._end_loop(self._end_args or None)


class _Wave:
    """A wave as a ``with`` block; per-wave counts and ``update(**metrics)`` become its args."""

    __slots__ = ("_metrics", "_tracer", "_wave_num")

    def __init__(self, tracer: RunnerTracer, wave_num: int) -> None:
        self._tracer = tracer
        self._wave_num = wave_num
        self._metrics: dict[str, Any] = {}

    def __enter__(self) -> Callable[..., None]:
        tracer = self._tracer
        tracer._begin_loop(L.SLICE_WAVE, {L.ARG_WAVE: self._wave_num})
        tracer._wave_counts = {}
        return self._metrics.update

    def __exit__(self, *exc: object) -> None:
        tracer = self._tracer
        counts, tracer._wave_counts = tracer._wave_counts, None
        metrics = self._metrics
        if counts:
            metrics = {**counts, **metrics}
        tracer._end_wave(metrics)


AnyRunnerTracer = RunnerTracer | NullRunnerTracer


# ----------------------------------------------------------------- helpers


def _num(value: Any) -> int | float:
    f = float(value)
    return int(f) if f.is_integer() else f


def _as_request(request: Any) -> ResourceRequest:
    if isinstance(request, ResourceRequest):
        return request
    if request is None:
        return ResourceRequest()
    if isinstance(request, dict):
        return ResourceRequest(
            num_cpus=request.get("num_cpus"),
            num_gpus=request.get("num_gpus"),
            memory_bytes=request.get("memory_bytes"),
        )
    return ResourceRequest(
        num_cpus=getattr(request, "num_cpus", None),
        num_gpus=getattr(request, "num_gpus", None),
        memory_bytes=getattr(request, "memory_bytes", None),
    )


def _summary(values: Iterable[int]) -> dict[str, int]:
    vals = sorted(values)
    return {"min": vals[0], "median": int(statistics.median(vals)), "max": vals[-1]}


def _ray_task_id(ref: Any) -> str:
    """Ray's id (hex) of the task that returns ``ref`` ("" if it cannot tell)."""
    try:
        return str(ref.task_id().hex())
    except Exception:
        return ""


def _measured_itself(metrics: Metrics, state: _TaskState, ref: Any) -> bool:
    """Whether ``metrics``, found in the return or error of ``state``'s task, are its own.

    A task whose input failed never runs: Ray hands it the upstream task's
    error, measurements included. Self-measuring tasks name their task; a
    traced call's measurements name Ray's task id, and ``ref`` (one of the
    task's return values) says which task it was.
    """
    if metrics.get("task_id") is not None:
        return str(metrics["task_id"]) == state.task_id
    ray_id = metrics.get("ray_task_id")
    if not ray_id or ref is None:
        return True  # nothing says otherwise
    own = _ray_task_id(ref)
    return not own or own == ray_id


def _get_each(refs: list[Any]) -> list[Any]:
    """Each ref's value, its error, or None if not ready within the timeout (one wait in all)."""
    import ray

    try:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_METRICS_TIMEOUT_S)
    except Exception:
        ready = []
    done = set(ready)
    values: list[Any] = []
    for ref in refs:
        if ref not in done:
            values.append(None)
            continue
        try:
            values.append(ray.get(ref, timeout=_METRICS_TIMEOUT_S))  # ready: returns at once
        except ray.exceptions.GetTimeoutError:
            values.append(None)
        except Exception as exc:
            values.append(exc)
    return values

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

Why it is built this way: the dispatch loop must stay fast, so every call
writes a few bytes and returns; task measurements arrive late (when a task is
received) and are written with their true timestamps, which the format layer
supports. Tracing never breaks the job: the first error writing the trace
logs one warning and turns the tracer into a no-op.

A :class:`NullRunnerTracer` with the same methods, all doing nothing, is what
runners get at level 0.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tracer.errors import TraceWriteError
from tracer.format import TraceWriter, Track
from tracer.ray import layout as L
from tracer.ray.levels import TracingLevel
from tracer.ray.memory_trace import MemoryTrace
from tracer.ray.resources import ResourceRequest
from tracer.ray.task_metrics import Metrics, TaskContext

logger = logging.getLogger("tracer")

_F = TypeVar("_F", bound=Callable[..., Any])

# Synthetic pids/tids for nodes and workers: real worker pids repeat across
# the machines of a cluster, and trace_processor keys threads by tid.
_NODE_PID_BASE = 2_000_000_000
_FLUSH_INTERVAL_S = 1.0
#: Received tasks are completed (measurements fetched in one ray.get) in
#: batches this big, or this often: a ray.get costs ~100 µs whatever its size.
_FETCH_BATCH = 64
_FETCH_INTERVAL_NS = 200_000_000


def _guarded(method: _F) -> _F:
    """Run a tracer method; on any error, disable tracing once instead of failing the job."""

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
        self.metrics: Metrics | None = None  # fetched early by task_error()
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
    ) -> None:
        self.writer = writer
        self.execution_id = execution_id
        self.runner_name = runner_name
        self.level = level
        self.trace_path: Path = writer.path
        self.memray_native_traces = memray_native_traces
        self._lock = threading.RLock()
        self._disabled = False
        self._closed = False
        self._metrics_actor = metrics_actor
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
        self._failures_seen: dict[int, str] = {}  # hash of an error's text -> its task
        self._last_fetch = 0
        # Tasks whose measurements may come through the metrics actor, by id (for their flow).
        self._actor_tasks: dict[str, _TaskState] = {}
        self._lost_measurements = 0
        self._memory = MemoryTrace(writer, level)

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
        self._flush_due = threading.Event()
        self._flusher = threading.Thread(
            target=self._flush_periodically, name=f"tracer-flush-{execution_id}", daemon=True
        )
        self._flusher.start()

    def _flush_periodically(self) -> None:
        """Flush when a wave ends, and at least every second.

        The file I/O happens here, not in the dispatch loop: in a Ray driver
        every system call is a chance for another thread to take the GIL, and
        the loop would pay for that at every wave.
        """
        while not self._stop_flusher.is_set():
            self._flush_due.wait(_FLUSH_INTERVAL_S)
            self._flush_due.clear()
            if self._stop_flusher.is_set():
                return
            self.flush()

    # ------------------------------------------------------------- failures

    def _disable(self, exc: BaseException) -> None:
        if self._disabled:
            return
        self._disabled = True
        self._stop_flusher.set()
        self._flush_due.set()
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
        return self._disabled

    # ---------------------------------------------------------- dispatch loop

    @contextlib.contextmanager
    def dispatch_wave(self, wave_num: int) -> Iterator[Callable[..., None]]:
        """A wave of the dispatch loop; yields ``update(**metrics)`` for the wave's args."""
        metrics: dict[str, Any] = {}
        self._begin_loop(L.SLICE_WAVE, {"wave": wave_num})
        self._wave_counts = {}
        try:
            yield metrics.update
        finally:
            counts, self._wave_counts = self._wave_counts, None
            if counts:
                metrics = {**counts, **metrics}
            self._end_wave(metrics)

    @_guarded
    def _begin_loop(self, name: str, args: dict[str, Any] | None = None) -> None:
        self.writer.begin(self._loop, name, category=L.CAT_SCHEDULER, args=args)

    @_guarded
    def _end_loop(self, args: dict[str, Any] | None = None) -> None:
        self.writer.end(self._loop, args=args)

    @_guarded
    def _end_wave(self, metrics: dict[str, Any]) -> None:
        if self._received and self.writer.now() - self._last_fetch >= _FETCH_INTERVAL_NS:
            self._complete_received()
        self._drain_metrics()
        self._memory.settle(self._memory_watermark())
        self.writer.end(self._loop, args=metrics or None)
        self._sample_resources()
        self._flush_due.set()  # the flusher thread writes it out now

    @contextlib.contextmanager
    def _loop_slice(self, name: str, args: dict[str, Any] | None = None) -> Iterator[None]:
        self._begin_loop(name, args)
        try:
            yield
        finally:
            self._end_loop()

    def dispatch_batching(self) -> contextlib.AbstractContextManager[None]:
        """Collecting tasks from the plan into a dispatch batch."""
        return self._loop_slice(L.SLICE_BATCHING)

    def dispatching(self) -> contextlib.AbstractContextManager[None]:
        """Submitting the batch to Ray."""
        return self._loop_slice(L.SLICE_DISPATCHING)

    @contextlib.contextmanager
    def awaiting(
        self, num_returns: int | None = None, timeout: float | None = None
    ) -> Iterator[Callable[..., None]]:
        """Waiting on in-flight tasks (``ray.wait``); yields ``update(**args)`` (``num_ready``)."""
        args: dict[str, Any] = {}
        if num_returns is not None:
            args["num_returns"] = num_returns
        if timeout is not None:
            args["timeout_s"] = float(timeout)
        end_args: dict[str, Any] = {}
        self._begin_loop(L.SLICE_AWAITING, args)
        try:
            yield end_args.update
        finally:
            self._end_loop(end_args or None)

    @contextlib.contextmanager
    def get_next_physical_plan(self) -> Iterator[Callable[..., None]]:
        """Polling the plan for its next item; yields ``update(**args)``."""
        end_args: dict[str, Any] = {}
        self._begin_loop(L.SLICE_PLAN_POLLING)
        try:
            yield end_args.update
        finally:
            self._end_loop(end_args or None)

    plan_polling = get_next_physical_plan

    @_guarded
    def _loop_instant(self, name: str, args: dict[str, Any] | None = None) -> None:
        self.writer.instant(self._loop, name, category=L.CAT_SCHEDULER, args=args)

    def mark_noop_task_start(self) -> None:
        """A task the runner completes without Ray (e.g. a no-op) starts."""
        self._begin_loop(L.SLICE_NOOP_TASK)

    def mark_noop_task_end(self) -> None:
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

    @_guarded
    def count_inflight_tasks(self, count: int) -> None:
        """Sample the number of tasks in flight."""
        self.writer.counter(self._inflight, count)

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
            self._finish_task(old, now, {L.ARG_STATUS: "superseded"})
        self._tasks[state.task_id] = state
        if self._metrics_actor is not None:
            self._actor_tasks[state.task_id] = state
        args: dict[str, Any] = {
            L.ARG_TASK_ID: state.task_id,
            L.ARG_STAGE_ID: stage_id,
            L.ARG_STAGE: stage.name,
            L.ARG_RESOURCE_REQUEST: request.as_args(),
        }
        if instructions:
            args[L.ARG_INSTRUCTIONS] = instructions
        if state.attempt:
            args[L.ARG_ATTEMPT] = state.attempt
        self.writer.begin(lane, stage.name, now, category=L.CAT_TASK, args=args)

    def _new_lane(self) -> Track:
        return self.writer.track(L.TASK_LANE, parent=self._tasks_root)

    @_guarded
    def task_dispatched(self, task_id: str) -> TaskContext | None:
        """The task was submitted to Ray; returns the context a traced task runs with."""
        state = self._tasks.get(str(task_id))
        if state is None or state.dispatch_ts is not None:
            return None
        now = self.writer.now()
        state.dispatch_ts = now
        self.writer.begin(state.lane, L.SLICE_DISPATCHED, now, category=L.CAT_TASK)
        req = state.request
        self._used_cpus += req.num_cpus or 0
        self._used_gpus += req.num_gpus or 0
        self._used_mem += req.memory_bytes or 0
        return TaskContext(
            self.execution_id, state.task_id, state.stage_id, int(self.level),
            self.memray_native_traces,
        )

    @_guarded
    def register_metrics_ref(self, task_id: str, ref: Any) -> None:
        """Where the task's measurements will arrive (the return channel)."""
        state = self._tasks.get(str(task_id))
        if state is not None:
            state.metrics_ref = ref
            self._actor_tasks.pop(state.task_id, None)

    def task_not_ready(self, task_id: str) -> None:
        """Daft compatibility: a waited-on task was not ready yet (not recorded)."""

    @_guarded
    def task_error(self, task_id: str) -> BaseException | None:
        """The error a received task ended with, or None (level >= 1, return channel only).

        Call it when the runner sees the task's result as ready, before
        :meth:`task_received_as_ready`; on an error, report it with
        :meth:`task_failed` instead. It reads the task's small measurements
        return (inlined by Ray, no data is fetched), which raises exactly when
        the task failed (a Ray error, an OOM kill, a crashed worker); the
        measurements are kept for the trace, so they are not fetched twice.
        Returns None for tasks without one (not dispatched traced, or the
        metrics actor channel).
        """
        state = self._tasks.get(str(task_id))
        if state is None or state.metrics_ref is None or state.metrics is not None:
            return None
        import ray

        try:
            metrics = ray.get(state.metrics_ref, timeout=10.0)
        except ray.exceptions.GetTimeoutError:
            return None  # left for the wave's drain
        except Exception as exc:
            return exc
        if isinstance(metrics, dict):
            state.metrics = metrics
        return None

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

    @_guarded
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
            return self._complete_received()
        return _NO_ERRORS

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

    def _complete_received(self) -> dict[str, BaseException]:
        """Fetch the measurements of received tasks, end their slices, write their executions."""
        states, self._received = self._received, []
        self._last_fetch = self.writer.now()
        if not states:
            return _NO_ERRORS
        fetch = [s for s in states if s.metrics_ref is not None and s.metrics is None]
        errors = self._fetch_metrics(fetch) if fetch else {}
        for state in states:
            error = errors.get(state.task_id)
            if error is None:
                self._finish_task(state, state.received_ts, None)
            else:
                self._record_failure(state.task_id, error, state.received_ts, state)
        return errors

    def _fetch_metrics(self, states: list[_TaskState]) -> dict[str, BaseException]:
        """One round trip for many measurements; sets ``state.metrics``, returns the errors."""
        import ray

        refs = [s.metrics_ref for s in states]
        values: list[Any]
        try:
            values = ray.get(refs, timeout=10.0)
        except ray.exceptions.GetTimeoutError:
            return {}  # left for the wave's drain
        except Exception:  # at least one failed: sort them out one by one (rare)
            values = []
            for ref in refs:
                try:
                    values.append(ray.get(ref, timeout=10.0))
                except ray.exceptions.GetTimeoutError:
                    values.append(None)
                except Exception as exc:
                    values.append(exc)
        errors: dict[str, BaseException] = {}
        for state, value in zip(states, values, strict=True):
            if isinstance(value, BaseException):
                errors[state.task_id] = value
            elif isinstance(value, dict):
                state.metrics = value
        return errors

    def _finish_task(self, state: _TaskState, now: int, args: dict[str, Any] | None) -> None:
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

    @_guarded
    def task_failed(self, task_id: str, error: BaseException) -> None:
        """The task's result is an error: end its slices with the error, mark where it ran."""
        self._record_failure(str(task_id), error, self.writer.now())

    def _record_failure(
        self, task_id: str, error: BaseException, now: int, state: _TaskState | None = None
    ) -> None:
        if state is None:
            state = self._tasks.pop(task_id, None)
        err: dict[str, Any] = dict(_error_args(error))
        metrics = _metrics_from_error(error)
        # A task whose input is a failed task's result never runs: Ray hands it
        # the same error, which carries the upstream task's measurements, or
        # (an OOM kill, a crash) the very same message. Record it as failed
        # upstream, with no execution and no mark on a worker.
        text_key = hash(str(error))
        upstream = self._failures_seen.get(text_key)
        if metrics is not None and str(metrics.get("task_id")) != str(task_id):
            upstream = str(metrics.get("task_id"))
        if upstream is not None and upstream != task_id:
            if state is not None:
                state.metrics_ref = None
                state.metrics = None
                self._finish_task(
                    state, now, {L.ARG_STATUS: "failed upstream", "upstream_task_id": upstream,
                                 **err},
                )
            return
        if len(self._failures_seen) < 10_000:
            self._failures_seen[text_key] = task_id
        where: dict[str, Any] = {}
        node_id, pid = (None, 0) if metrics is not None else _where_from_error(error)
        if node_id:
            where[L.ARG_NODE_ID] = node_id
        if pid:
            where[L.ARG_WORKER_PID] = pid
        memory: dict[str, Any] = {}
        if state is not None:
            memory[L.ARG_MEMORY_REQUESTED] = int(state.request.memory_bytes or 0)
        at_kill = _memory_at_kill(error)
        if at_kill:
            memory[L.ARG_MEMORY_AT_KILL] = at_kill
        if state is not None:
            state.metrics_ref = None
            state.metrics = None
            self._finish_task(state, now, {L.ARG_STATUS: "failed", **err, **where, **memory})
        if metrics is not None:
            metrics.setdefault("error_type", err[L.ARG_ERROR_TYPE])
            metrics.setdefault("error", err[L.ARG_ERROR])
            self._write_execution(metrics, state)
            return
        track = self._loop
        if node_id or pid:
            node = self._node(node_id or "unknown")
            track = self._worker(node, pid).track if pid else node.track
        self.writer.instant(
            track, L.INSTANT_TASK_FAILED, now, category=L.CAT_EXECUTION,
            args={L.ARG_TASK_ID: str(task_id), **err, **memory},
        )

    @_guarded
    def stage_done(self, stage_id: int) -> None:
        """No more tasks will be created for the stage: write its slice and flows now."""
        stage = self._stages.get(stage_id)
        if stage is not None:
            if any(s.stage_id == stage_id for s in self._received):
                self._complete_received()
            if any(s.stage_id == stage_id for s in self._pending_metrics):
                self._drain_metrics()  # its memory summary needs their measurements
            self._write_stage(stage)

    # ---------------------------------------------------------- measurements

    def _drain_metrics(self) -> None:
        """Fetch measurements of received tasks (return channel) and of the actor channel."""
        pending, self._pending_metrics = self._pending_metrics, []
        for state in pending:
            if state.metrics is not None:  # fetched by task_error()
                self._write_execution(state.metrics, state)
        pending = [s for s in pending if s.metrics is None]
        if pending:
            import ray

            refs = [s.metrics_ref for s in pending]
            try:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=10.0)
            except Exception:
                ready = []
            ready_set = set(ready)
            for state in pending:
                if state.metrics_ref not in ready_set:
                    self._lost(state.task_id, "measurements did not arrive in time")
                    continue
                try:
                    metrics = ray.get(state.metrics_ref, timeout=10.0)
                except Exception as exc:  # the task failed: its error carries them
                    metrics = _metrics_from_error(exc)
                    if metrics is None:
                        self._lost(state.task_id, f"{type(exc).__name__}")
                        continue
                    if str(metrics.get("task_id")) != state.task_id:
                        continue  # never ran: an upstream task failed (these are its measurements)
                self._write_execution(metrics, state)
        if self._metrics_actor is not None:
            import ray

            try:
                items = ray.get(self._metrics_actor.drain.remote(), timeout=10.0)
            except Exception as exc:
                self._metrics_actor = None
                self._lost("*", f"metrics actor unreachable ({type(exc).__name__})")
                items = []
            for metrics in items:
                task = self._actor_tasks.pop(str(metrics.get("task_id")), None)
                self._write_execution(metrics, task)

    def _lost(self, task_id: str, why: str) -> None:
        self._lost_measurements += 1
        self.writer.instant(
            self._loop, L.INSTANT_METRICS_LOST, category=L.CAT_SCHEDULER,
            args={L.ARG_TASK_ID: task_id, "reason": why},
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
            tid = ((node.index + 1) << 32) | (pid & 0xFFFFFFFF)
            track = self.writer.thread_track(
                _NODE_PID_BASE + node.index, tid, f"{L.WORKER_THREAD_PREFIX} {pid}"
            )
            worker = node.workers[pid] = _Worker(track, pid)
        return worker

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
        start = int(m.get("start_ns") or 0)
        end = int(m.get("end_ns") or start)
        if not start:
            return
        task_id = str(m.get("task_id", state.task_id if state else "?"))
        stage_id = m.get("stage_id", state.stage_id if state else None)
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
        args.update(self._memory_args(m, state, stage, node.track, worker.track, start, end))
        if m.get("error_type"):
            args[L.ARG_STATUS] = "failed"
            args[L.ARG_ERROR_TYPE] = m["error_type"]
            args[L.ARG_ERROR] = m.get("error", "")
        flows = [state.flow] if state is not None else None
        name = stage.name if stage is not None else "task"
        self.writer.begin(
            track, name, start, category=L.CAT_EXECUTION, args=args, terminating_flows=flows
        )
        self.writer.end(track, end)
        if m.get("error_type"):
            self.writer.instant(
                track, L.INSTANT_TASK_FAILED, end, category=L.CAT_EXECUTION,
                args={L.ARG_TASK_ID: task_id, L.ARG_ERROR_TYPE: m["error_type"]},
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

    @_guarded
    def flush(self) -> None:
        """Write everything buffered to the file; stop tracing if the file was removed."""
        if not self._closed:
            self._flush_checked()

    def _flush_checked(self) -> None:
        self.writer.flush()
        self._last_flush = time.monotonic()
        # On Linux, writes to a removed file succeed and vanish: check it is still there.
        if self.writer.file_removed():
            raise TraceWriteError(f"trace file {self.trace_path} was removed while being written")

    def close(self, error: BaseException | None = None) -> None:
        """Finish the trace: fetch outstanding measurements, write stages, close the file."""
        if self._closed:
            return
        self._stop_flusher.set()
        self._flush_due.set()
        if self._flusher is not threading.current_thread():
            self._flusher.join(timeout=5.0)
        self._close(error)
        self._closed = True
        if not self._disabled:
            with contextlib.suppress(Exception):
                self.writer.close()

    @_guarded
    def _close(self, error: BaseException | None) -> None:
        self._complete_received()
        self._drain_metrics()
        now = self.writer.now()
        for state in list(self._tasks.values()):
            self._finish_task(state, now, {L.ARG_STATUS: "unfinished"})
        self._tasks.clear()
        self._pending_metrics.clear()
        self._actor_tasks.clear()
        for stage in self._stages.values():
            self._write_stage(stage)
        self._memory.settle(None)
        args: dict[str, Any] = {"lost_measurements": self._lost_measurements}
        if error is not None:
            args.update(_error_args(error))
        self.writer.end(self._loop, args=args)


class _NullContext:
    """A reusable no-op context manager that yields a no-op updater."""

    __slots__ = ()

    def __enter__(self) -> Callable[..., None]:
        return _noop

    def __exit__(self, *exc: object) -> None:
        return None


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


_NULL_CONTEXT = _NullContext()
_NO_ERRORS: dict[str, BaseException] = {}


class NullRunnerTracer:
    """The tracer at level 0: every call does nothing and costs a method call."""

    enabled = False
    disabled = False
    level = TracingLevel.OFF
    trace_path = None
    execution_id = ""

    def dispatch_wave(self, wave_num: int) -> _NullContext:
        return _NULL_CONTEXT

    def dispatch_batching(self) -> _NullContext:
        return _NULL_CONTEXT

    def dispatching(self) -> _NullContext:
        return _NULL_CONTEXT

    def awaiting(
        self, num_returns: int | None = None, timeout: float | None = None
    ) -> _NullContext:
        return _NULL_CONTEXT

    def get_next_physical_plan(self) -> _NullContext:
        return _NULL_CONTEXT

    plan_polling = get_next_physical_plan

    def mark_noop_task_start(self) -> None:
        pass

    def mark_noop_task_end(self) -> None:
        pass

    def mark_handle_none_task(self) -> None:
        pass

    def mark_handle_materialized_result(self) -> None:
        pass

    def mark_handle_task_add_to_batch(self) -> None:
        pass

    def mark_dispatch_task(self) -> None:
        pass

    def mark_dispatch_actor_task(self) -> None:
        pass

    def count_inflight_tasks(self, count: int) -> None:
        pass

    def task_created(
        self,
        task_id: str,
        stage_id: int,
        resource_request: Any,
        instructions: str | None = None,
        *,
        stage_name: str | None = None,
    ) -> None:
        pass

    def task_dispatched(self, task_id: str) -> None:
        return None

    def register_metrics_ref(self, task_id: str, ref: Any) -> None:
        pass

    def task_not_ready(self, task_id: str) -> None:
        pass

    def task_error(self, task_id: str) -> None:
        return None

    def task_received_as_ready(self, task_id: str) -> None:
        pass

    def tasks_received_as_ready(self, task_ids: Iterable[str]) -> dict[str, BaseException]:
        return _NO_ERRORS

    def task_failed(self, task_id: str, error: BaseException) -> None:
        pass

    def stage_done(self, stage_id: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, error: BaseException | None = None) -> None:
        pass


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


def _root_cause(error: BaseException) -> BaseException:
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def _error_args(error: BaseException) -> dict[str, str]:
    cause = _root_cause(error)
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    # A task's own exception (RayTaskError) ends with "Type: message" after its
    # traceback; Ray's system errors (OOM kill, crashed worker) lead with the
    # summary, followed by details (the OOM killer's report runs to ~40 lines).
    message = lines[-1] if lines and cause is not error else " ".join(lines[:1])
    if _is_oom_kill(error) and len(lines) > 1:
        reason = next((line for line in lines if line.startswith("OOM kill reason")), "")
        message = f"{message} {reason}".strip()
    return {
        L.ARG_ERROR_TYPE: type(cause).__name__ if cause is not error else type(error).__name__,
        L.ARG_ERROR: message[:500],
    }


def _is_oom_kill(error: BaseException) -> bool:
    """Ray's ``OutOfMemoryError``, told by name so importing this module needs no Ray."""
    return any(cls.__name__ == "OutOfMemoryError" for cls in type(error).__mro__)

_KILL_MEMORY_RE = re.compile(r"actual memory used=([0-9.]+)\s*([KMGT]?B)")
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def _memory_at_kill(error: BaseException) -> int | None:
    """The killed worker's memory use in Ray's OOM report (``actual memory used=0.89GB``)."""
    match = _KILL_MEMORY_RE.search(str(error))
    if match is None:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def _metrics_from_error(error: BaseException) -> Metrics | None:
    for candidate in (error, getattr(error, "cause", None)):
        metrics = getattr(candidate, "__tracer_metrics__", None)
        if isinstance(metrics, dict):
            return metrics
    return None


_PID_RE = re.compile(r"pid=(\d+)")
_NODE_RE = re.compile(r"ID: ([0-9a-f]{16,})")


def _where_from_error(error: BaseException) -> tuple[str | None, int]:
    """Node id and worker pid that Ray's error names (OOM kills and crashes say both)."""
    pid = getattr(error, "pid", None)
    text = str(error)
    if not isinstance(pid, int):
        match = _PID_RE.search(text)
        pid = int(match.group(1)) if match else 0
    node = _NODE_RE.search(text)
    return (node.group(1) if node else None), pid

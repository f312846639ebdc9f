"""One traced Ray Data execution: Ray Data's facts, drawn by the run timeline.

An :class:`ExecutionTracer` is made for each dataset execution (by the
callback, :mod:`.callback`) and turns what Ray Data reports into the facts
:class:`~tracer.ray.timeline.RunTimeline` draws, so that a Ray Data trace has
the runner's layout:

* **the dispatch loop** is the streaming executor's scheduling loop: a
  ``wave`` slice per step (from one ``on_execution_step`` to the next, with
  the tasks it submitted and saw finish), the tasks in flight (all, and per
  operator), the object-store memory Ray Data's blocks hold and what its
  resource manager has left, each operator's queued input blocks and
  backpressure (:meth:`ExecutionTracer._sample_queues`);
* **actors starting**: each actor an actor-pool operator starts, from its
  creation until Ray Data saw it ready (:mod:`.actors`);
* **tasks**: each operator's data task from submitted to finished (Ray Data
  decides and submits in one call, so there is no waiting before
  ``dispatched``), with Ray's task id, the operator's request (its ray
  remote args) and blocks/rows/bytes in and out; from the operators' own
  ``OpRuntimeMetrics`` hooks, wrapped on this execution's operators only;
* **stages** are the physical operators (Ray Data's fused names), numbered
  as Ray Data numbers them (its operator ids end with the same index);
* **executions**: each map task measured in its worker (:mod:`.worker`),
  arriving through :mod:`.channel`, written once both the measurement and
  the task's end are in (the end brings Ray Data's USS peak, the execution's
  actual memory at level 1);
* a task killed by Ray (OOM killer, crashed worker) is marked where Ray's
  error says it ran, and its Ray states drawn (whether and when it ran);
* **Ray's own events** of the tasks (:mod:`tracer.ray.events_channel`, as a
  runner's: read by the flusher thread and after the execution ended, in a
  thread of their own, :mod:`tracer.ray.finishing`): Ray's phases nested in
  each measured execution, the scheduling states beside the tasks' lanes, and the
  executions of the tasks nobody measures in their workers (all-to-all
  operators' tasks, :mod:`.all_to_all`): where and when Ray ran them.

Ray Data calls the hooks from its executor thread (and the callbacks from
the thread that started or shut down the execution): every entry point
takes the tracer's lock, and any error in it stops tracing this execution
(one warning; the trace so far stays valid) without ever reaching Ray Data.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracer.format import TraceWriter
from tracer.integrations.ray_data import _compat as compat
from tracer.integrations.ray_data import all_to_all
from tracer.integrations.ray_data.actors import ActorPoolWatch
from tracer.integrations.ray_data.channel import (
    CLOSE_GRACE_S,
    START_GRACE_S,
    MeasurementChannel,
)
from tracer.integrations.ray_data.tasks import (
    DataTask,
    Stage,
    data_error_args,
    finite,
    hooked,
    new_token,
)
from tracer.ray import layout as L
from tracer.ray.events_channel import RayEventsChannel
from tracer.ray.finishing import finish_trace
from tracer.ray.flusher import Flusher
from tracer.ray.levels import TracingLevel
from tracer.ray.resources import ResourceRequest
from tracer.ray.task_errors import (
    exception_message,
    kill_args,
    killed_workers,
    root_cause,
    top_memory_users,
    where_from_error,
)
from tracer.ray.task_metrics import Metrics
from tracer.ray.timeline import RunTimeline

__all__ = ["RUNNER_NAME", "DataTask", "ExecutionTracer", "new_token"]

logger = logging.getLogger("tracer")

#: The runner name of Ray Data traces (the Scheduler process, the file name).
RUNNER_NAME = "ray-data"
#: Memory counter samples (late by nature) are written out at most this often.
_SETTLE_INTERVAL_NS = 50_000_000
#: Ray Data's resource figures are sampled at most this often (a step is ~5-15 ms).
_SAMPLE_INTERVAL_NS = 20_000_000
_HOOKS = ("on_task_submitted", "on_task_output_generated", "on_task_finished")


class ExecutionTracer:
    """Traces one Ray Data execution into one trace file; see the module doc."""

    def __init__(
        self,
        executor: Any,
        writer: TraceWriter,
        level: TracingLevel,
        channel: MeasurementChannel,
        tokens: dict[int, str],
    ) -> None:
        self.writer = writer
        self.trace_path: Path = writer.path
        self.execution_id = compat.dataset_id(executor)
        self.level = level
        self._executor = executor
        self._channel = channel
        self._stopped_said = False  # the channel's stop is on the loop (_say_if_stopped)
        self._lock = threading.RLock()
        self._disabled = False
        self._closed = False
        self._timeline = RunTimeline(
            writer, execution_id=self.execution_id, runner_name=RUNNER_NAME, level=level,
        )
        # Ray Data gives a map task without a memory= its average output's size as one
        # (2.60, per task, past the operator's arguments): the request the trace judges
        # by stays the operator's own, what the user set (Ray's is in assigned_resources).
        self._timeline.adopt_ray_reservation = False
        self._stages: dict[int, Stage] = {}
        self._by_token: dict[str, Stage] = {}
        self._tasks: dict[tuple[int, int], DataTask] = {}
        self._arrived: collections.deque[list[Metrics]] = collections.deque()
        self._early: dict[tuple[int, int], list[Metrics]] = {}  # before their task's submission
        self._hooked: list[tuple[Any, str]] = []
        self._bulk_released: list[Callable[[], None]] = []  # all-to-all operators' hooks
        self._pools: list[ActorPoolWatch] = []  # actor-pool operators' actors starting
        # Executions ready to write, by start: (start_ns, order, measurements, task).
        self._ready: list[tuple[int, int, Metrics, DataTask]] = []
        self._order = 0
        self._step = 0
        self._step_dispatched = 0
        self._step_finished = 0
        self._inflight = 0
        self._last_settle = 0
        self._last_sample = 0
        self._flusher: Flusher | None = None
        #: Ray's events of the tasks (None: TRACER_RAY_EVENTS=0, or no Ray to ask).
        self._ray_events: RayEventsChannel | None = None
        self._end_ts = 0
        try:
            self._ray_events = RayEventsChannel.start(self._timeline, self._lock)
        except Exception as exc:
            logger.debug("tracer: not reading Ray's task events: %s", exc)
        try:
            for index, op in enumerate(compat.operators(executor)):
                stage = Stage(index, op, tokens.get(id(op)))
                self._stages[index] = stage
                if stage.token is not None:
                    self._by_token[stage.token] = stage
                    channel.register(stage.token, self._arrived.append)
                self._hook(op, stage)
            self._timeline.begin_loop(L.SLICE_WAVE, {L.ARG_WAVE: 0})
            writer.flush()
        except BaseException:
            self._disabled = True  # the hooks already in place do nothing, then go
            self._timeline.stop_driver_gc()
            self._release()
            self._stop_ray_events()
            raise
        self._flusher = Flusher(self.flush, f"tracer-flush-{self.execution_id}")

    # ------------------------------------------------------------ guard

    @property
    def timeline(self) -> RunTimeline:
        """What the facts are drawn by (under the lock: :meth:`guard`)."""
        return self._timeline

    def guard(self, fn: Callable[..., None], *args: Any) -> None:
        """``fn(*args)`` under the lock, unless tracing stopped; an error stops it."""
        self._guard(fn, *args)

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        if self._disabled:
            return
        try:
            with self._lock:
                if not self._disabled:
                    fn(*args)
        except Exception as exc:
            with contextlib.suppress(Exception):
                self._disable(exc)

    def _disable(self, exc: BaseException) -> None:
        with self._lock:
            if self._disabled:
                return
            self._disabled = True
        if self._flusher is not None:
            self._flusher.stop()
        self._timeline.stop_driver_gc()
        self._release()
        self._stop_ray_events()
        logger.warning(
            "tracer: tracing stopped for Ray Data execution %s after an error (%s: %s); "
            "it continues untraced; the trace so far is in %s",
            self.execution_id, type(exc).__name__, exc, self.trace_path,
        )
        # The stages' slices start the arrows to the executions already written: without
        # them, those arrows' ends point at nothing (best effort: the state may be the bug).
        with contextlib.suppress(Exception), self._lock:
            self._timeline.stages.write_all()
        with contextlib.suppress(Exception):
            self.writer.close()

    def _stop_ray_events(self) -> None:
        """No more reads of Ray's events (tracing stopped)."""
        channel, self._ray_events = self._ray_events, None
        if channel is not None:
            with contextlib.suppress(Exception):
                channel.stop()

    # ------------------------------------------------------------ operator hooks

    def _hook(self, op: Any, stage: Stage) -> None:
        release = all_to_all.hook_operator(op, stage, self)
        if release is not None:
            self._bulk_released.append(release)
        pool = ActorPoolWatch.watch(stage, self._timeline, self.writer, self._guard)
        if pool is not None:
            self._pools.append(pool)
            self._hooked.extend((pool.pool, name) for name in pool.hooked)
        metrics = compat.op_metrics(op)
        if metrics is None:
            return
        for name, fact in zip(_HOOKS, (self._submitted, self._output, self._finished), strict=True):
            original = getattr(metrics, name, None)
            if original is None:
                continue
            setattr(metrics, name, hooked(original, fact, stage, self._guard))
            self._hooked.append((metrics, name))

    def _release(self) -> None:
        """Give Ray Data its operators' hooks back; no more measurements for this execution."""
        for owner, name in self._hooked:  # op metrics' methods, actor pools' methods
            with contextlib.suppress(Exception):
                if getattr(owner.__dict__.get(name), "__tracer_hook__", False):
                    delattr(owner, name)
        self._hooked = []
        for release in self._bulk_released:
            with contextlib.suppress(Exception):
                release()
        self._bulk_released = []
        for stage in self._stages.values():
            if stage.token is not None:
                self._channel.unregister(stage.token)

    def _submitted(self, stage: Stage, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        index, inputs, ray_task_id = compat.submitted_args(args, kwargs)
        self.dispatch(
            stage, index, compat.bundle_counts(inputs),
            ray_task_id or compat.ray_task_id_of(stage.op, index),
        )

    def dispatch(
        self,
        stage: Stage,
        index: int,
        counts_in: tuple[int, int, int],
        ray_task_id: str | None,
        *,
        request: ResourceRequest | None = None,
        args: dict[str, Any] | None = None,
    ) -> DataTask:
        """A task of ``stage`` submitted to Ray now (under the lock): its slices begin.

        ``request``: the task's own (else its operator's); ``args``: more
        annotations of its slice.
        """
        now = self.writer.now()
        key = (stage.stage_id, index)
        task = self._timeline.task_created(
            DataTask, f"{stage.stage_id}-{index}", stage.stage_id, request or stage.request,
            now, stage_name=stage.name, args=args,
        )
        task.counts_in = counts_in
        task.ray_task_id = ray_task_id
        task.expects_measurements = stage.measured
        self._timeline.task_dispatched(task, now)
        task.key = key
        self._tasks[key] = task
        task.measurements = self._early.pop(key, [])
        stage.inflight += 1
        self._inflight += 1
        self._step_dispatched += 1
        self._timeline.count_stage_inflight(stage.stage_id, stage.inflight)
        self._timeline.count_inflight(self._inflight)
        return task

    def _output(self, stage: Stage, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        index, output = compat.output_args(args, kwargs)
        task = self._tasks.get((stage.stage_id, index))
        if task is None:
            return
        blocks, rows, size = compat.bundle_counts(output)
        task.blocks_out += blocks
        task.rows_out += rows
        task.bytes_out += size
        uss = compat.uss_of_output(output)
        if uss is not None and (task.uss_peak is None or uss > task.uss_peak):
            task.uss_peak = uss

    def _finished(self, stage: Stage, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        index, error, uss = compat.finished_args(args, kwargs)
        task = self._tasks.get((stage.stage_id, index))
        if task is None or task.ended:
            return
        if uss is not None:
            task.uss_peak = max(uss, task.uss_peak or 0)
        if task.ray_task_id is None:  # Ray before 2.54 (see _compat)
            task.ray_task_id = compat.ray_task_id_of(stage.op, index)
        now = self.writer.now()
        end = self._io_args(task)
        if error is not None:
            end.update(self.failure(task, error, now, stage.name))
        self.end(stage, task, now, end)

    def end(self, stage: Stage, task: DataTask, now: int, end_args: dict[str, Any]) -> None:
        """``task`` of ``stage`` ended at ``now`` (under the lock), with ``end_args``."""
        task.ended = True
        task.end_args = end_args
        self._timeline.task_ended(task, now, end_args)
        stage.inflight -= 1
        self._inflight -= 1
        self._step_finished += 1
        self._timeline.count_stage_inflight(stage.stage_id, stage.inflight)
        self._timeline.count_inflight(self._inflight)
        if task.measurements:
            self._write_executions(task)
        elif not task.expects_measurements:
            del self._tasks[task.key]
            if self._ray_events is not None and task.ray_task_id and task.killed:
                # Marked where it was killed; Ray's states say whether and when it ran.
                self._timeline.expect_ray_states(task, task.ray_task_id)
            elif self._ray_events is not None and not stage.measured and task.ray_task_id:
                # Nothing of ours ran in its worker (an all-to-all operator's task):
                # Ray's events say where and when it ran; how it failed, as read here.
                error = None
                if L.ARG_ERROR_TYPE in end_args:
                    error_type = str(end_args[L.ARG_ERROR_TYPE])
                    line = str(end_args.get(L.ARG_ERROR, ""))
                    error = (error_type, exception_message(line, error_type))
                self._timeline.await_execution(task, task.ray_task_id, error)

    def _io_args(self, task: DataTask) -> dict[str, Any]:
        blocks_in, rows_in, bytes_in = task.counts_in
        args: dict[str, Any] = {}
        if task.ray_task_id:
            args[L.ARG_RAY_TASK_ID] = task.ray_task_id
        args.update({
            L.ARG_BLOCKS_IN: blocks_in, L.ARG_ROWS_IN: rows_in, L.ARG_BYTES_IN: bytes_in,
            L.ARG_BLOCKS_OUT: task.blocks_out, L.ARG_ROWS_OUT: task.rows_out,
            L.ARG_BYTES_OUT: task.bytes_out,
        })
        return args

    def failure(
        self, task: DataTask, error: BaseException, now: int, op_name: str | None = None
    ) -> dict[str, Any]:
        """The task's end annotations for ``error``; a task Ray killed is marked where it ran.

        A task whose own code raised sends its measurements (its execution then
        shows the error); one that Ray killed (OOM killer, a crashed worker, a
        lost node) never will: Ray's error says where it ran. ``op_name``: its
        operator's name, which Ray Data gives its tasks: an OOM report of
        several workers names the task each ran.
        """
        args: dict[str, Any] = {L.ARG_STATUS: L.STATUS_FAILED, **data_error_args(error)}
        if root_cause(error) is not error:
            return args  # the task's own exception: its measurements will say where
        task.expects_measurements = False
        task.killed = True  # marked here; of Ray's events, only its states say more
        node_id, pid = where_from_error(error, op_name)
        memory = kill_args(error, op_name)
        killed = killed_workers(error)
        args.update(memory)
        if node_id:
            args[L.ARG_NODE_ID] = node_id
        if pid:
            args[L.ARG_WORKER_PID] = pid
        if killed:
            self._timeline.workers_killed(node_id, killed, now)
            self._timeline.task_killed(task, node_id, now, memory.get(L.ARG_MEMORY_AT_KILL))
        track = self._timeline.locate(node_id, pid) if node_id or pid else self._timeline.loop
        mark: dict[str, Any] = {L.ARG_TASK_ID: task.task_id, **data_error_args(error), **memory}
        top = top_memory_users(error)
        if top:
            mark[L.ARG_OOM_TOP_MEMORY_USERS] = top
        self._timeline.mark(track, L.INSTANT_TASK_FAILED, now, mark)
        return args

    # ------------------------------------------------------------ measurements

    def _take_arrived(self) -> None:
        while self._arrived:
            for m in self._arrived.popleft():
                stage = self._by_token.get(str(m.get("op")))
                if stage is None:
                    continue
                key = (stage.stage_id, int(m.get("task_idx", -1)))
                task = self._tasks.get(key)
                if task is None:
                    self._early.setdefault(key, []).append(m)
                    continue
                task.measurements.append(m)
                if task.ended:
                    self._write_executions(task)

    def _write_executions(self, task: DataTask) -> None:
        """Queue the task's measured executions, once it ended (its USS peak is known then).

        They are written in the order they started, once no execution still to
        come can start before them (:meth:`_write_ready`): measurements arrive
        in the order tasks end and reach the actor, and a worker's track takes
        an execution that starts before the last one written as an overlap.
        """
        if not task.ended or not task.measurements:
            return
        measurements, task.measurements = task.measurements, []
        for m in measurements:
            if task.uss_peak is not None and len(measurements) == 1:
                m["uss_peak"] = task.uss_peak
            self._order += 1
            heapq.heappush(self._ready, (int(m.get("start_ns") or 0), self._order, m, task))
        task.expects_measurements = False
        self._tasks.pop(task.key, None)

    def _write_ready(self, watermark: int | None) -> None:
        """Write the queued executions that start before ``watermark`` (None: all)."""
        ready = self._ready
        if not ready:
            return
        with self._timeline.late_batch():
            while ready and (watermark is None or ready[0][0] <= watermark):
                _, _, m, task = heapq.heappop(ready)
                self._timeline.execution(m, task)

    def _watermark(self) -> int:
        """No execution still to come can start before this: the earliest dispatch pending."""
        pending = [t.dispatch_ts for t in self._tasks.values() if t.dispatch_ts is not None]
        return min(pending, default=self.writer.now())

    # ------------------------------------------------------------ the loop

    def step(self) -> None:
        """``on_execution_step``: the step ends; counters; measurements that came."""
        if self._disabled:
            return
        self._channel.poll()  # outside the lock: it may hand other executions theirs
        self._guard(self._step_ended)

    def _say_if_stopped(self) -> None:
        """The channel stopped (its actor failed): when, on the dispatch loop, once."""
        failed = self._channel.failed
        if failed is not None and not self._stopped_said:
            self._stopped_said = True
            self._timeline.loop_instant(
                L.INSTANT_MEASUREMENTS_STOPPED, {L.ARG_REASON: str(failed)[:300]})

    def _step_ended(self) -> None:
        tl = self._timeline
        self._say_if_stopped()
        tl.end_loop({
            L.ARG_TASKS_DISPATCHED: self._step_dispatched,
            L.ARG_TASKS_FINISHED: self._step_finished,
        })
        self._step += 1
        self._step_dispatched = self._step_finished = 0
        for pool in self._pools:
            pool.check()
        now = self.writer.now()
        if now - self._last_sample >= _SAMPLE_INTERVAL_NS:
            self._last_sample = now
            self._sample_queues(now)
            self._sample_resources()
        self._take_arrived()
        now = self.writer.now()
        if now - self._last_settle >= _SETTLE_INTERVAL_NS:
            self._last_settle = now
            watermark = self._watermark()
            self._write_ready(watermark)
            tl.settle(watermark)
        tl.begin_loop(L.SLICE_WAVE, {L.ARG_WAVE: self._step})

    def _sample_queues(self, now: int) -> None:
        """Each stage's queued input blocks and whether Ray Data holds it back (what its
        progress says: "Queued blocks: 168", "[backpressured:tasks(...)]"); a mark on the
        loop at each reason not seen before for the stage."""
        states = compat.op_states(self._executor)
        if states is None:
            return
        tl = self._timeline
        for stage in self._stages.values():
            state = states.get(stage.op)
            queued = compat.queued_blocks(state) if state is not None else None
            if queued is not None and (queued or stage.queue_drawn):
                stage.queue_drawn = True
                stage.queued_max = max(stage.queued_max, queued)
                tl.count_stage_queued(stage.stage_id, queued, stage.name)
            held = compat.backpressure(stage.op)
            if held is None:
                continue
            on = held != (None, None)
            if on or stage.backpressure_drawn:
                stage.backpressure_drawn = True
                tl.count_stage_backpressured(stage.stage_id, on, stage.name)
                # Counted while blocks wait for it (Ray Data holds an operator back with
                # nothing queued too: an idle stage, not a delayed one).
                self._held_back(stage, on and queued != 0, now)
            if on and held not in stage.backpressure_reasons:
                stage.backpressure_reasons.add(held)
                args: dict[str, Any] = {L.ARG_STAGE_ID: stage.stage_id, L.ARG_STAGE: stage.name}
                if held[0] is not None:
                    args[L.ARG_BACKPRESSURE_TASKS] = held[0]
                if held[1] is not None:
                    args[L.ARG_BACKPRESSURE_OUTPUTS] = held[1]
                tl.loop_instant(L.INSTANT_BACKPRESSURED, args)

    @staticmethod
    def _held_back(stage: Stage, on: bool, now: int) -> None:
        """The stage's time held back with blocks queued, from sample to sample."""
        if on and stage.backpressured_since is None:
            stage.backpressured_since = now
        elif not on and stage.backpressured_since is not None:
            stage.backpressured_ns += now - stage.backpressured_since
            stage.backpressured_since = None

    def _sample_resources(self) -> None:
        figures = compat.resources(self._executor)
        if figures is None:
            return
        usage, limits = figures
        tl = self._timeline
        tl.count_object_store_used(int(getattr(usage, "object_store_memory", 0) or 0))
        keys = ("cpu", "gpu", "memory", "object_store_memory")
        limit = {key: finite(getattr(limits, key, None)) for key in keys}
        if not any(limit.values()):
            # Ray Data's limits are all 0 until its resource manager has the cluster's
            # resources from its autoscaling coordinator (~1 s into each execution, ~3 s
            # on a new cluster): nothing is known to be available yet, and drawn as 0 it
            # would look like a starved cluster.
            return
        left: dict[str, float | None] = {}
        for key in keys:
            used = finite(getattr(usage, key, None))
            lim = limit[key]
            left[key] = None if lim is None or used is None else max(lim - used, 0.0)
        tl.sample_available(
            # No GPUs in the cluster: no GPU counter (the runner's layout draws none either).
            cpus=left["cpu"], gpus=left["gpu"] if limit["gpu"] else None, memory=left["memory"],
            object_store_memory=left["object_store_memory"],
        )

    # ------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """Write what is buffered (from the flusher thread); the disk outside the lock."""
        if self._disabled or self._closed:
            return
        channel = self._ray_events
        if channel is not None:
            try:
                channel.poll()
            except Exception as exc:  # Ray's events are extra: losing them stops nothing
                logger.debug("tracer: reading Ray's task events failed: %s", exc)
        try:
            with self._lock:
                if self._disabled or self._closed:
                    return
                self._timeline.draw_driver_gc()
                self.writer.detach()
            self.writer.write_detached()
            if self._flusher is not None:
                self._flusher.last_flush = time.monotonic()
        except Exception as exc:
            self._disable(exc)

    def close(self, error: BaseException | None) -> None:
        """The execution ended (``error``: how it failed): wait briefly for the measurements
        still on their way, end what is open, write the stages; Ray's last events are
        drawn and the file closed in the background (:func:`~tracer.ray.finishing.finish_trace`:
        Ray Data's executor goes on at once)."""
        if self._closed:
            return
        if self._flusher is not None:
            self._flusher.stop(join=True)
        start = time.monotonic()
        channel = self._channel
        while not self._disabled and self._awaiting_measurements():
            grace = CLOSE_GRACE_S if channel.answered else START_GRACE_S
            if time.monotonic() - start >= grace or channel.failed is not None:
                break
            channel.poll(wait=0.2)
            self._guard(self._take_arrived)
        self._guard(self._close, error)
        self._closed = True
        self._release()
        if not self._disabled:
            self._disabled = True
            finish_trace(
                self.writer, self._lock, self._timeline, self._ray_events, self._end_ts
            )
            logger.info(
                "tracer: trace of Ray Data execution %s written to %s",
                self.execution_id, self.trace_path,
            )

    def _awaiting_measurements(self) -> bool:
        with self._lock:
            return any(t.ended and t.expects_measurements for t in self._tasks.values())

    def _close(self, error: BaseException | None) -> None:
        tl = self._timeline
        tl.end_loop({
            L.ARG_TASKS_DISPATCHED: self._step_dispatched,
            L.ARG_TASKS_FINISHED: self._step_finished,
        })
        now = self.writer.now()
        why = self._channel.failed or "measurements did not arrive before the close"
        for task in list(self._tasks.values()):
            if not task.ended:  # still in flight: its measurements not lost, not there yet
                task.ended = True
                task.expects_measurements = False
                task.end_args = {**self._io_args(task), L.ARG_STATUS: L.STATUS_UNFINISHED}
                tl.task_ended(task, now, task.end_args)
            if task.measurements:
                self._write_executions(task)
            elif task.expects_measurements:
                tl.lost(task.task_id, why)
        self._tasks.clear()
        for pool in self._pools:
            pool.close(now)
        self._early.clear()  # measurements of attempts whose task was written already
        self._write_ready(None)
        for stage in self._stages.values():
            if stage.inflight:
                tl.count_stage_inflight(stage.stage_id, 0)
            # The execution is over: nothing queued, nothing held back (equal samples are
            # not written).
            figures: dict[str, Any] = {}
            if stage.queue_drawn:
                tl.count_stage_queued(stage.stage_id, 0)
                figures[L.ARG_QUEUED_BLOCKS_MAX] = stage.queued_max
            if stage.backpressure_drawn:
                tl.count_stage_backpressured(stage.stage_id, False)
                self._held_back(stage, False, now)
                figures[L.ARG_BACKPRESSURED_NS] = stage.backpressured_ns
            if figures:
                tl.stage_figures(stage.stage_id, figures)
        if self._inflight:
            tl.count_inflight(0)
        tl.finish()
        self._end_ts = self.writer.now()
        end_args = data_error_args(error) if error is not None else {}
        if self._channel.failed is not None:
            self._say_if_stopped()
            end_args[L.ARG_MEASUREMENTS_STOPPED] = str(self._channel.failed)[:300]
        tl.end_run(self._end_ts, end_args or None)

"""The runner tracer: what a Ray runner's dispatch loop calls to be traced.

One :class:`RunnerTracer` traces one execution (one run of a dispatch loop)
into one trace file. It is a *producer* of the run's facts: its calls follow
Daft's RayRunner tracer call for call, and it turns them, with the
measurements its tasks send back, into facts for the
:class:`~tracer.ray.timeline.RunTimeline`, which draws them (the layout is
there, not here). Where things live:

* the dispatch-loop calls (waves, phases, marks, counters): :mod:`tracer.ray.runner_loop`;
* the tasks' lifecycle (created, dispatched, received in batches, failed,
  cancelled, stages done): here;
* the trace's lifecycle (flushing, closing, stopping after an error):
  :mod:`tracer.ray.runner_lifecycle`;
* the measurement channels: :mod:`tracer.ray.return_channel` (each traced
  task's last return value), :mod:`tracer.ray.actor_channel` (the metrics
  actor, for tasks that measure themselves and failed attempts) and, at
  level 1 with ``TRACER_EXECUTIONS=ray_events``, Ray's own events
  (:mod:`tracer.ray.events_channel`: the tasks report to Ray, and their
  executions are drawn once Ray's events bring them);
* what a failure was, and the attempts Ray made: :mod:`tracer.ray.failures`.

**Tasks reported before they finished.** A runner that calls
:meth:`~RunnerTracer.task_received_as_ready` for a task still running is not
waited for: reads of measurements wait for nothing (but at the close), the
task's slice ends where it was received (``received_unfinished``), one
warning per execution says so, and its execution is drawn once it finished
(at a wave's end or a flush), its stage's slice then.

**Lost measurements.** Every wait on Ray has a timeout. Measurements that do
not arrive are recorded as lost (an instant per task, and a count on the
execution slice); a metrics actor that stops answering is called no more
after its first failure, and the tasks whose measurements it held or would
have received are recorded as lost.

Why it is built this way: the dispatch loop must stay fast, so every call
writes a few bytes and returns; task measurements arrive late (when a task
is received) and are written with their true timestamps. Tracing never
breaks the job: the first error writing the trace logs one warning and
turns the tracer into a no-op.

A :class:`~tracer.ray.null_tracer.NullRunnerTracer` with the same methods,
all doing nothing, is what runners get at level 0.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tracer.format import TraceWriter
from tracer.ray import layout as L
from tracer.ray.actor_channel import ActorChannel
from tracer.ray.connection import ray_connected
from tracer.ray.events_channel import (
    SOURCE_RAY_EVENTS,
    RayEventsChannel,
    executions_source,
)
from tracer.ray.failures import Failures
from tracer.ray.flusher import Flusher
from tracer.ray.guard import guarded, guarded_failures
from tracer.ray.levels import TracingLevel
from tracer.ray.null_tracer import NullRunnerTracer
from tracer.ray.resources import ResourceRequest, as_request
from tracer.ray.return_channel import CancelMark, ReturnChannel
from tracer.ray.runner_lifecycle import LifecycleCalls, close_at_exit
from tracer.ray.runner_loop import LoopCalls
from tracer.ray.runner_task import RunnerTask
from tracer.ray.task_metrics import TaskContext
from tracer.ray.timeline import RunTimeline

logger = logging.getLogger("tracer")

#: Memory counter samples (late by nature) are written out at most this often.
_SETTLE_INTERVAL_NS = 50_000_000
#: Received tasks are completed (measurements fetched in one ray.get) in
#: batches this big, or this often: a ray.get costs ~100 µs whatever its size.
_FETCH_BATCH = 64
_FETCH_INTERVAL_NS = 200_000_000
#: The end of a task slice the runner received before the task finished.
_RECEIVED_UNFINISHED = {L.ARG_RECEIVED_UNFINISHED: True}


class RunnerTracer(LifecycleCalls, LoopCalls):
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
        ray_events: bool = True,
    ) -> None:
        self.writer = writer
        self.execution_id = execution_id
        self.runner_name = runner_name
        self.level = level
        self.trace_path: Path = writer.path
        self.memray_native_traces = memray_native_traces
        self.memray_all_allocations = memray_all_allocations
        self._lock = threading.RLock()
        self._ray_at_start = ray_connected()  # what the close says if Ray is gone by then
        self._disabled = False  # no more tracing: after an error, or once closed
        self._failed = False  # tracing stopped after an error
        self._noop_open = 0  # no-op task slices open on the loop
        self._closed = False
        self._wave_counts: dict[str, int] | None = None  # per-wave counts, inside a wave
        self._misuse_said: set[str] = set()  # kinds of misuse warned of (once each)
        self._timeline = timeline = RunTimeline(
            writer, execution_id=execution_id, runner_name=runner_name, level=level,
            cluster_resources=cluster_resources,
        )
        self._tasks: dict[str, RunnerTask] = {}
        # Received in batches, completed (measurements fetched, slices ended) in
        # bigger batches: one ray.get per _FETCH_BATCH tasks or _FETCH_INTERVAL_NS.
        self._received: list[RunnerTask] = []
        self._completing: list[RunnerTask] = []  # the batch _complete_received is writing
        self._last_fetch = 0
        # Failures found when completing received tasks, until a call returns them.
        self._unreported: dict[str, BaseException] = {}
        self._returns = ReturnChannel(timeline)
        # Stages done whose slices wait for executions of tasks received unfinished.
        self._stages_waiting: set[Any] = set()
        self._failures = Failures(timeline, self._finish_task, self._in_flight)
        # The execution has (or had) a metrics actor: its channel, also once it is gone.
        self._actor = (
            ActorChannel(metrics_actor, timeline, self._failures, self._known_task)
            if metrics_actor is not None else None
        )
        self._template: TaskContext | None = None  # see task_template
        # Ray's own events of the tasks (read by the flusher thread and at the close).
        self._ray_events: RayEventsChannel | None = None
        if ray_events:
            try:
                self._ray_events = RayEventsChannel.start(timeline, self._lock)
            except Exception as exc:  # private Ray API: never a reason not to trace
                logger.debug("tracer: not reading Ray's task events: %s", exc)
        #: Level 1's executions come from Ray's events, not a return value (see executions_source).
        self.via_ray_events = (
            level == TracingLevel.TIMELINE and metrics_actor is None
            and self._ray_events is not None and executions_source() == SOURCE_RAY_EVENTS
        )
        writer.flush()
        self._flusher = Flusher(self.flush, f"tracer-flush-{execution_id}")
        self._last_settle = 0
        close_at_exit(self)  # a runner that never closes it still gets a whole trace

    # ---------------------------------------------------------- dispatch loop

    @guarded
    def _end_wave(self, metrics: dict[str, Any]) -> None:
        now = self.writer.now()
        if self._received and now - self._last_fetch >= _FETCH_INTERVAL_NS:
            self._complete_received()
            now = self.writer.now()
        returns = self._returns
        if returns.pending or returns.unfinished or (
            self._actor is not None and self._actor.alive
        ):
            self._drain_metrics()
        if self._returns.cancelled:
            self._poll_cancelled(0)
        if now - self._last_settle >= _SETTLE_INTERVAL_NS:  # memory counters: late anyway
            self._last_settle = now
            self._timeline.settle(self._memory_watermark())
        self._timeline.end_loop(metrics or None)
        self._timeline.sample_resources()
        self._flusher.wave_ended = True  # the flusher thread writes it out within 20 ms

    # ------------------------------------------------------------------ tasks

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
        # Once per task: the guard (see tracer.ray.guard) spelled out, one call fewer.
        if self._disabled:
            return
        try:
            with self._lock:
                self._task_created(task_id, stage_id, resource_request, instructions, stage_name)
        except Exception as exc:
            self._disable(exc)

    def _task_created(
        self, task_id: str, stage_id: int, resource_request: ResourceRequest | Any,
        instructions: str | None, stage_name: str | None,
    ) -> None:
        request = as_request(resource_request)
        now = self.writer.now()
        task_id = str(task_id)
        old = self._tasks.get(task_id)
        task = self._timeline.task_created(
            RunnerTask, task_id, stage_id, request, now, instructions=instructions,
            stage_name=stage_name, attempt=0 if old is None else old.attempt + 1,
        )
        if old is not None:  # a retry reuses the id: close the earlier attempt's slices
            self._finish_task(old, now, {L.ARG_STATUS: L.STATUS_SUPERSEDED})
        self._tasks[task_id] = task
        if self._actor is not None:  # even once the actor is gone: to count what is lost
            self._actor.tasks[task_id] = task

    def task_dispatched(self, task_id: str) -> TaskContext | None:
        """The task was submitted to Ray; returns the context a traced task runs with."""
        task = self._dispatched(task_id)
        return None if task is None else self._task_context(task)

    def _dispatched(self, task_id: str) -> RunnerTask | None:
        """Record the dispatch; the task's state if a traced call may measure it.

        What :class:`~tracer.ray.RayFunctionWrapper` calls: the context the
        task runs with is the execution's (:attr:`task_template`), the same
        for every task, so none is made per task.
        """
        if self._disabled:
            return None
        try:
            with self._lock:
                task = self._tasks.get(task_id if task_id.__class__ is str else str(task_id))
                if task is None:
                    self._say_misuse(
                        "not_created", "task %r of execution %s was dispatched (with_tracing, "
                        "task_dispatched) but never created (task_created), or was already "
                        "received: it runs untraced. Call task_created before dispatching "
                        "it. Further such tasks are not warned about.",
                        task_id, self.execution_id,
                    )
                    return None
                if task.dispatch_ts is not None:
                    # Recorded already (by the runner, then again by the wrapper that
                    # submits it): the wrapper still gets the context, once.
                    return task if task.metrics_ref is None and task.ray_task is None else None
                self._timeline.task_dispatched(task, self.writer.now())
                return task
        except Exception as exc:
            self._disable(exc)
            return None

    def _task_context(self, task: RunnerTask) -> TaskContext:
        return TaskContext(
            self.execution_id, task.task_id, task.stage_id, int(self.level),
            self.memray_native_traces, self._has_actor, self.memray_all_allocations,
            self.via_ray_events,
        )

    @property
    def _has_actor(self) -> bool:
        return self._actor is not None and self._actor.alive

    @property
    def task_template(self) -> TaskContext:
        """The context every traced task of this execution runs with (its task id empty)."""
        template = self._template
        if template is None or template.metrics_actor != self._has_actor:
            template = self._template = TaskContext(
                self.execution_id, "", None, int(self.level), self.memray_native_traces,
                self._has_actor, self.memray_all_allocations, self.via_ray_events,
            )
        return template

    def register_metrics_ref(self, task_id: str, ref: Any) -> None:
        """Where the task's measurements will arrive (the return channel)."""
        self._register(task_id, ref, via_ray_events=False)

    def register_ray_task(self, task_id: str, ref: Any) -> None:
        """The task reports through Ray's events: ``ref`` (one of its return values) says
        which of Ray's tasks it is. Its execution is drawn once Ray's events bring it."""
        self._register(task_id, ref, via_ray_events=True)

    def _register(self, task_id: str, ref: Any, via_ray_events: bool) -> None:
        if self._disabled:
            return
        try:
            with self._lock:
                task = self._tasks.get(task_id if task_id.__class__ is str else str(task_id))
                if task is None:
                    return
                if via_ray_events:
                    task.ray_task = ref.task_id()
                    return
                task.metrics_ref = ref
                if self._actor is not None:
                    self._actor.tasks.pop(task.task_id, None)
        except Exception as exc:
            self._disable(exc)

    def task_not_ready(self, task_id: str) -> None:
        """Daft compatibility: a waited-on task was not ready yet (not recorded)."""

    @guarded
    def task_received_as_ready(self, task_id: str, stage_id: int | None = None) -> None:
        """The runner saw the task's result as ready.

        Completed as :meth:`tasks_received_as_ready` completes a batch: its
        measurements are fetched with others', and a task whose result is an
        error (a runner that never calls ``ray.get`` on it, as Daft's loop,
        would not say so) ends ``failed`` with it, marked where it ran; the
        failures are not returned. Runners that receive tasks in batches
        should prefer :meth:`tasks_received_as_ready`. ``stage_id`` is
        accepted for Daft's runner, which passes it; the tracer knows every
        task's stage since :meth:`task_created`.
        """
        self._receive((task_id,))

    @guarded_failures
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
        self._receive(task_ids)
        return self._take_failures()

    def _receive(self, task_ids: Iterable[str]) -> None:
        """Tasks received now: released, their completion batched (see above)."""
        now = self.writer.now()
        tasks = self._tasks
        received = self._received
        release = self._timeline.release
        for task_id in task_ids:
            task = tasks.pop(str(task_id), None)
            if task is not None:
                task.received_ts = now
                release(task, now)  # its slices end at `now`, written later
                received.append(task)
        if len(received) >= _FETCH_BATCH or now - self._last_fetch >= _FETCH_INTERVAL_NS:
            self._complete_received()

    @guarded_failures
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

    def _complete_received(self) -> None:
        """Fetch the measurements of received tasks, end their slices, write their executions.

        Failures found are kept for :meth:`_take_failures`."""
        tasks, self._received = self._received, []
        self._last_fetch = self.writer.now()
        if not tasks:
            return
        self._completing = tasks  # still findable by Failures.measured_task while written
        fetch = [t for t in tasks if t.metrics_ref is not None and t.metrics is None]
        returns = self._returns
        unfinished = len(returns.unfinished)
        errors = returns.fetch(fetch) if fetch else {}
        if self._actor is not None and self._actor.alive and (
            errors or any(t.metrics is not None and t.metrics.get("attempt") for t in fetch)
        ):
            # Retried or failed tasks: their earlier attempts may be in the actor (or queued
            # for it, if it is still starting: then this waits for it).
            self._actor.drain(wait=True)
        with self._timeline.late_batch():  # their slices end, and they ran, in the past
            if len(returns.unfinished) > unfinished:  # some not finished yet (rare)
                early = {t.task_id for t, _ in returns.unfinished[unfinished:]}
                for task in tasks:
                    error = errors.get(task.task_id)
                    if error is None:
                        args = (_RECEIVED_UNFINISHED
                                if task.task_id in early or returns.finished_after_received(task)
                                else None)
                        self._finish_task(task, task.received_ts, args)
                    else:
                        self._record_failure(task.task_id, error, task.received_ts, task)
            else:
                late = returns.finished_after_received
                for task in tasks:
                    error = errors.get(task.task_id)
                    if error is None:
                        # Received unfinished, and finished by the time it was read.
                        args = _RECEIVED_UNFINISHED if late(task) else None
                        self._finish_task(task, task.received_ts, args)
                    else:
                        self._record_failure(task.task_id, error, task.received_ts, task)
        self._completing = []
        self._unreported.update(errors)

    def _finish_task(self, task: RunnerTask, now: int, args: dict[str, Any] | None) -> None:
        """End the task's slices at ``now`` with ``args``; write its execution if measured."""
        if task.metrics is not None and task.metrics.get("attempt"):
            args = {**(args or {}), **self._failures.attempt_args(task.task_id, task.metrics)}
        elif self._actor is not None and args is None and task.metrics_ref is None:
            self._actor.received(task)
        self._timeline.task_ended(task, now, args)
        if task.ray_task is not None:
            ray_task, task.ray_task = task.ray_task, None
            # Received or cancelled: Ray's events say where (and whether) it ran. A failure
            # the runner reported was drawn from its error (Failures.record).
            if args is None or args.get(L.ARG_STATUS) == L.STATUS_CANCELLED:
                self._timeline.await_execution(task, ray_task.hex())
        if task.metrics is not None:
            metrics, task.metrics = task.metrics, None
            self._timeline.execution(metrics, task)
        elif task.metrics_ref is not None and self._returns.queue(task):
            self._drain_metrics()

    def _in_flight(self) -> Iterator[RunnerTask]:
        """Tasks not yet completed: in flight, received, or in the batch being completed."""
        yield from self._tasks.values()
        yield from self._received
        yield from self._completing

    def _known_task(self, task_id: str) -> RunnerTask | None:
        """The task of that id if it is not completed yet (for an attempt the actor reports)."""
        return next((t for t in self._in_flight() if t.task_id == task_id), None)

    @guarded
    def task_failed(self, task_id: str, error: BaseException) -> None:
        """The task's result is an error: end its slices with the error, mark where it ran."""
        self._record_failure(str(task_id), error, self.writer.now())

    def _record_failure(
        self, task_id: str, error: BaseException, now: int, task: RunnerTask | None = None
    ) -> None:
        if task is None:
            task = self._tasks.pop(task_id, None)
        if self._actor is not None:
            # Its measurements come in its error, or never: not through the actor.
            self._actor.tasks.pop(task_id, None)
        self._failures.record(task_id, error, now, task)

    @guarded
    def task_cancelled(self, task_id: str) -> None:
        """The runner cancelled the task (``ray.cancel``): end its slices as cancelled.

        Its lane and resources are released at once. If it was running and
        stops gracefully, Ray's error names its worker, which gets a "task
        cancelled" mark a wave or two later (at close, after up to
        ``CLOSE_GRACE_S``); with a metrics actor, which brings the cancelled
        attempt's measurements, its execution is written instead. A task
        cancelled before it started, or force-killed (``force=True``), has
        neither: Ray's error then says neither whether nor where it ran.
        Nothing here waits on Ray.
        """
        task = self._tasks.pop(str(task_id), None)
        if task is None:
            return  # unknown, or already received: cancelling it changed nothing
        if self._actor is not None:
            self._actor.cancelled(task)
        self._failures.forget(task.task_id)
        ref, task.metrics_ref = task.metrics_ref, None
        task.metrics = None
        self._finish_task(task, self.writer.now(), {L.ARG_STATUS: L.STATUS_CANCELLED})
        if ref is not None:
            self._returns.cancelled.append((task, ref))

    def _poll_cancelled(self, timeout: float) -> None:
        self._returns.poll_cancelled(timeout, self._cancelled_running)

    def _cancelled_running(self, task_id: str, mark: CancelMark) -> None:
        """A cancelled task stopped where ``mark`` says: marked there, unless the metrics
        actor may still bring its execution (held until it does, or the close)."""
        if self._has_actor:
            assert self._actor is not None
            self._actor.cancelled_running[task_id] = mark
        else:
            self._timeline.mark(mark[0], L.INSTANT_TASK_CANCELLED, mark[1], mark[2])

    @guarded
    def stage_done(self, stage_id: int) -> None:
        """No more tasks will be created for the stage: write its slice and flows now.

        Called while some of its tasks are still in flight, it leaves the
        slice to the close, so that it still ends with the stage's last task.
        """
        stage = self._timeline.stages.get(stage_id)
        if stage is None:
            return
        if any(t.stage_id == stage_id for t in self._received):
            self._complete_received()
        if stage.outstanding:
            return
        returns = self._returns
        if any(t.stage_id == stage_id for t in returns.pending) or any(
            t.stage_id == stage_id for t, _ in returns.unfinished
        ):
            self._drain_metrics()  # its memory summary needs their measurements
        if any(t.stage_id == stage_id for t, _ in returns.unfinished):
            self._stages_waiting.add(stage_id)  # written once they are in (or at the close)
            return
        self._timeline.stage_done(stage_id)

    # ---------------------------------------------------------- measurements

    def _drain_metrics(self) -> None:
        """Fetch measurements of received tasks (return channel) and of the actor channel."""
        returns = self._returns
        if not returns.pending and not returns.unfinished and self._actor is None:
            return  # the common case, once per wave: nothing waits
        with self._timeline.late_batch():
            returns.drain()
            if self._actor is not None:
                self._actor.drain()
        if self._stages_waiting:
            self._write_waiting_stages()

    def flush(self) -> None:
        """Write everything buffered to the file (see :meth:`LifecycleCalls.flush`), with
        the executions of tasks received unfinished that have finished since."""
        if self._returns.unfinished:
            self._poll_unfinished()
        super().flush()

    @guarded
    def _poll_unfinished(self) -> None:
        """Executions of tasks received unfinished that have finished since (no waiting)."""
        if self._closed or self._returns.closing:
            return
        with self._timeline.late_batch():
            self._returns.poll_unfinished()
        if self._stages_waiting:
            self._write_waiting_stages()

    def _write_waiting_stages(self) -> None:
        """The slices of stages done whose tasks received unfinished are all drawn now."""
        waiting = {t.stage_id for t, _ in self._returns.unfinished}
        for stage_id in [s for s in self._stages_waiting if s not in waiting]:
            self._stages_waiting.discard(stage_id)
            self._timeline.stage_done(stage_id)

    def _close(self, error: BaseException | None) -> int:
        """The close (see :meth:`LifecycleCalls._close`): from now on, measurements of tasks
        received unfinished are waited for, up to the return channel's timeout."""
        self._returns.closing = True
        return super()._close(error)

    def _memory_watermark(self) -> int:
        """No execution still to come can start before this: the earliest dispatch in flight."""
        now = self.writer.now()
        dispatched = [t.dispatch_ts for t in self._tasks.values() if t.dispatch_ts is not None]
        dispatched.extend(t.dispatch_ts for t in self._returns.pending if t.dispatch_ts)
        dispatched.extend(t.dispatch_ts for t, _ in self._returns.unfinished if t.dispatch_ts)
        dispatched.extend(t.dispatch_ts for t in self._received if t.dispatch_ts)
        dispatched.extend(t.dispatch_ts for t, _ in self._returns.cancelled if t.dispatch_ts)
        return min(dispatched, default=now)


AnyRunnerTracer = RunnerTracer | NullRunnerTracer


"""The run timeline: the one writer of what a run looks like in a trace.

Every producer of a run's facts (the Daft-style :class:`~tracer.ray.RunnerTracer`
and its measurement channels, the integrations) writes through one
:class:`RunTimeline`, so the layout (:mod:`tracer.ray.layout`) is drawn in
one place. Its inputs are plain facts with their timestamps: a loop phase
began or ended; a task was created with this request, dispatched, ended; an
execution ran on this node and worker from t0 to t1 with these measurements;
a task failed here; a stage is done. It knows nothing of Ray's API (no
object refs, no errors to parse): what a fact means is the producer's
business, how it is drawn is this module's.

What it draws, under one **Run** root track per run and in this order
(the order a user reads it in the Perfetto UI, see :mod:`tracer.ray.layout`):

* a **Scheduler** group with the **Dispatch loop**: an ``execution``
  slice around the run, the loop's phases nested in it, instants; then
  counters of tasks in flight and the cluster's available CPUs, GPUs and
  memory (what the dispatched tasks asked for, subtracted from the totals;
  or, for an engine whose scheduler counts for itself, its own figures:
  :meth:`RunTimeline.sample_available`, with the object store's, and
  :meth:`RunTimeline.count_object_store_used`), and per stage, tasks in
  flight (:meth:`RunTimeline.count_stage_inflight`), queued blocks and
  backpressure (:mod:`.scheduler`);
* **Ray tasks**: each task from created to ended with its nested
  ``dispatched`` slice, on a pool of lanes (tracks of one name, which the UI
  merges) so that thousands of overlapping tasks never break nesting; a lane
  is reused only by a task created after the last one on it ended;
* **Stages** with their arrows, from each task's launch (:mod:`.stages`),
  and their actor pools starting (:mod:`.actors`);
* **nodes and workers** with their executions and memory counters
  (:mod:`.nodes`, :mod:`.memory`);
* under the dispatch loop, the driver's **Python GC** pauses of 1 ms or more
  (:mod:`.gc_pauses`: a collection holds the GIL, so the loop stood still
  meanwhile), drawn at each flush (:meth:`RunTimeline.draw_driver_gc`), and
  every collection's count and time on the run's slice.

All are plain tracks: the UI appends a process's pid and a thread's tid to
its name, and a node's or a worker's would be synthetic (worker pids repeat
across machines). The loop's real pid and tid are args of its ``execution``
slice.

Timestamps are the writer's clock (``time.time_ns`` by default, which every
node shares); late facts are written at their true time. Not thread-safe:
producers serialise their calls (the runner tracer holds its lock).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from tracer.format import TraceWriter, Track
from tracer.ray import layout as L
from tracer.ray.levels import TracingLevel
from tracer.ray.resources import ResourceRequest
from tracer.ray.timeline.actors import ActorStart, ActorStarts
from tracer.ray.timeline.awaited import Awaited, measurements
from tracer.ray.timeline.gc_pauses import GCPauses
from tracer.ray.timeline.memory import MemoryTrace
from tracer.ray.timeline.nodes import Nodes
from tracer.ray.timeline.ray_phases import RayPhases, RayTaskEvents
from tracer.ray.timeline.scheduler import (
    STAGE_BACKPRESSURED,
    STAGE_INFLIGHT,
    STAGE_QUEUED,
    SchedulerCounters,
    number,
)
from tracer.ray.timeline.stages import Stage, Stages

__all__ = [
    "CANCEL_ERRORS", "ActorStart", "Measurements", "RayTaskEvents", "RunTimeline", "TimelineTask",
]

#: Measurements of one execution, as a worker reports them (see
#: :mod:`tracer.ray.task_metrics`): ``start_ns``, ``end_ns``, ``node_id``,
#: ``pid``, ``ray_task_id``, ``assigned_resources``, ``attempt``, the memory
#: figures (``heap_peak``, ``rss_peak``, ``rss_start``, ``rss_end``,
#: ``memory_samples``, ...), ``error_type`` and ``error`` when it failed; and
#: ``task_id`` / ``stage_id`` when it was not given with its task.
Measurements = dict[str, Any]

#: Error types that mean a task was cancelled (Ray's, and what a task sees inside).
CANCEL_ERRORS = frozenset({"TaskCancelledError", "KeyboardInterrupt"})
#: Errors of an attempt whose worker process is gone with it (its counters end there).
_WORKER_GONE = frozenset({"WorkerCrashedError", "OutOfMemoryError", "NodeDiedError"})

_T = TypeVar("_T", bound="TimelineTask")

logger = logging.getLogger("tracer")

class TimelineTask:
    """What the timeline keeps of one task while it is open.

    Producers may subclass it (adding ``__slots__``) to keep their own
    per-task state in the same object: :meth:`RunTimeline.task_created`
    makes the instance.
    """

    __slots__ = (
        "attempt",
        "created_ts",
        "dispatch_ts",
        "end_ts",
        "flow",
        "lane",
        "ray_states_drawn",
        "released",
        "request",
        "stage_id",
        "task_id",
    )

    def __init__(
        self, task_id: str, stage_id: Any, lane: Track, flow: int, request: ResourceRequest
    ) -> None:
        self.task_id = task_id
        self.stage_id = stage_id
        self.lane = lane
        self.flow = flow  # the stage's arrow to the task's first execution; 0 once drawn
        self.request = request
        self.created_ts = 0  # when it was launched: where the arrow starts
        self.dispatch_ts: int | None = None
        #: When its slices ended (:meth:`RunTimeline.task_ended`).
        self.end_ts: int | None = None
        #: Ray's scheduling states are on its lane (once: attempts would overlap).
        self.ray_states_drawn = False
        self.released = False
        self.attempt = 0


class RunTimeline:
    """Draws one run (one execution of a dispatch loop) into ``writer``; see the module doc."""

    def __init__(
        self,
        writer: TraceWriter,
        *,
        execution_id: str,
        runner_name: str = "runner",
        level: TracingLevel = TracingLevel.TIMELINE,
        cluster_resources: dict[str, float] | None = None,
        loop_pid: int | None = None,
        loop_tid: int | None = None,
        driver_gc: bool = True,
    ) -> None:
        """``driver_gc``: record the driver's Python GC while the run is open
        (:meth:`draw_driver_gc`); a producer whose loop runs in another process
        than the timeline says False."""
        self.writer = w = writer
        self.execution_id = execution_id
        self.level = level
        pid = os.getpid() if loop_pid is None else loop_pid
        tid = threading.get_native_id() if loop_tid is None else loop_tid
        #: The run's root track: everything below, in the order of tracer.ray.layout.
        self.root = w.track(
            f"{L.RUN_TRACK_PREFIX} {execution_id}", child_ordering="explicit", merge=False,
            description=f"Run {execution_id} of {runner_name}: its dispatch loop, tasks, "
            "stages and the nodes they ran on",
        )
        self.scheduler = w.track(
            f"{L.SCHEDULER_PROCESS} ({runner_name})", parent=self.root, rank=0,
            child_ordering="explicit", merge=False,
            description=f"The dispatch loop of {runner_name} (process {pid}, thread {tid}) "
            "and what it holds",
        )
        #: The dispatch loop's track: its phases, and marks that belong nowhere else.
        self.loop = w.track(
            L.DISPATCH_LOOP_THREAD, parent=self.scheduler, rank=0, merge=False,
            description="Waves of the loop: polling the plan, batching, dispatching, awaiting",
        )
        self.loop_pid, self.loop_tid = pid, tid
        self._tasks_root = w.track(
            L.TASKS_TRACK, parent=self.root, rank=1, merge=False, child_ordering="explicit",
            description="Each task from its creation to its receipt by the runner, "
            "with its 'dispatched' part",
        )
        self.stages = Stages(w, w.track(
            L.STAGES_TRACK, parent=self.root, rank=2, child_ordering="explicit", merge=False,
            description="Each stage from its first task's creation to its last task's end; "
            "arrows from each task's launch to its execution",
        ))
        self.counters = SchedulerCounters(w, self.scheduler, self.stages, cluster_resources)
        self.nodes = Nodes(w, self.root, first_rank=3)
        self.memory = MemoryTrace(w, level)
        self._ray = RayPhases(w, self.nodes, self._tasks_root)
        self._ray.on_failed_attempt = self._attempt_failed
        self._awaited = Awaited()  # executions Ray's events will bring (see .awaited)
        # Free lanes with the time they were released: a lane is reused only by a
        # task created after that, so its slices never overlap the last ones, even
        # when those end late (at their receipt time) in the file.
        self._free_lanes: list[tuple[Track, int]] = []
        self._request_annotations: dict[int, tuple[ResourceRequest, dict[str, Any]]] = {}
        #: Tasks whose measurements will never arrive (see :meth:`lost`).
        self.lost_measurements = 0
        #: Executions Ray reserved another memory for than their task's request said.
        self.request_mismatches = 0
        #: Executions memray measured with a tracker of their own, and the first's reason.
        self.memray_per_task = 0
        self.memray_per_task_reason: str | None = None
        #: Judge executions by the memory Ray reserved for them where it differs from
        #: their task's request (counted, the first logged: a runner that says one
        #: request and gives Ray another has a bug to fix). A producer whose engine adds
        #: a memory= of its own past what the producer sees says False: Ray Data gives an
        #: operator without one its average output's size (16 B to ~128 MiB), and level
        #: 1's whole-worker peaks then flagged every task of every pipeline "over".
        self.adopt_ray_reservation = True
        #: When the run's slice began: nothing of the run is drawn before it.
        self.start_ts = w.now()
        self._actors = ActorStarts(w, self.stages, self.start_ts)
        # The driver's Python GC: recorded until the run's end, or the timeline goes.
        self._gc = GCPauses(w, self.loop) if driver_gc else None
        w.begin(
            self.loop,
            L.SLICE_EXECUTION,
            self.start_ts,
            category=L.CAT_SCHEDULER,
            args={"execution_id": execution_id, "runner": runner_name, "tracing_level": int(level),
                  "pid": pid, "tid": tid},
        )
        self.sample_resources()

    # ------------------------------------------------------------ the loop

    def begin_loop(self, name: str, args: dict[str, Any] | None = None) -> None:
        """A phase of the dispatch loop begins (nested in the one open)."""
        self.writer.begin(self.loop, name, category=L.CAT_SCHEDULER, args=args)

    def end_loop(self, args: dict[str, Any] | None = None) -> None:
        self.writer.end(self.loop, args=args)

    def loop_instant(self, name: str, args: dict[str, Any] | None = None) -> None:
        self.writer.instant(self.loop, name, category=L.CAT_SCHEDULER, args=args)

    def count_inflight(self, count: int) -> None:
        """The runner's own count of its tasks in flight (from then on the only one drawn)."""
        self.counters.count_inflight(count)

    def sample_resources(self) -> None:
        """Sample the available CPUs, GPUs and memory: the cluster's totals less what
        dispatched tasks hold, never below 0 (see :meth:`.SchedulerCounters.sample`)."""
        self.counters.sample()

    def sample_resources_if_changed(self) -> None:
        """:meth:`sample_resources` if a task was dispatched or released since the last
        sample: for a producer to call at each phase of its loop, so that the counters
        follow the dispatches and receipts within a phase (a wave's end alone leaves
        them a wave late where a loop dispatches at a wave's start and then waits)."""
        self.counters.sample_if_changed()

    def count_stage_inflight(self, stage_id: Any, count: int) -> None:
        """Tasks of one stage in flight: a counter per stage under the Scheduler
        (``COUNTER_STAGE_INFLIGHT``), next to the run's *tasks in flight*."""
        self.counters.count_stage(stage_id, STAGE_INFLIGHT, count)

    def count_stage_queued(self, stage_id: Any, blocks: int, stage_name: str | None = None) -> None:
        """Blocks queued at one stage's input (``COUNTER_STAGE_QUEUED``), as the producer's
        scheduler counts them; a stage's counter is declared at its first sample (named
        with ``stage_name`` if its first task is still to come)."""
        self.counters.count_stage(stage_id, STAGE_QUEUED, blocks, stage_name)

    def count_stage_backpressured(
        self, stage_id: Any, held_back: bool, stage_name: str | None = None
    ) -> None:
        """Whether the producer's scheduler holds one stage back now
        (``COUNTER_STAGE_BACKPRESSURED``: 1 or 0)."""
        self.counters.count_stage(stage_id, STAGE_BACKPRESSURED, int(held_back), stage_name)

    def stage_figures(self, stage_id: Any, args: dict[str, Any]) -> None:
        """Annotations of the stage's slice (its END), the producer's own figures of it
        (Ray Data's: ``queued_blocks_max``, ``backpressured_ns``); for a stage whose slice
        is still to be written (a stage that ran no task has none)."""
        stage = self.stages.get(stage_id)
        if stage is not None and not stage.written:
            stage.end_args.update(args)

    def sample_available(
        self,
        *,
        cpus: float | None = None,
        gpus: float | None = None,
        memory: float | None = None,
        object_store_memory: float | None = None,
    ) -> None:
        """Resources left as the producer's own scheduler counts them (Ray Data's
        resource manager), on the *available ...* counters that
        :meth:`sample_resources` fills from the timeline's own accounting (a
        producer uses one or the other), plus *available object store memory*.
        None: not known, not sampled. Like every counter, a sample equal to the
        last is not written."""
        self.counters.sample_available(cpus, gpus, memory, object_store_memory)

    def count_object_store_used(self, nbytes: int) -> None:
        """Object-store memory held by the run's data, as the producer's scheduler counts
        it (``COUNTER_OBJECT_STORE_USED``)."""
        self.counters.count_object_store_used(nbytes)

    def draw_driver_gc(self) -> None:
        """Draw the driver's long GC pauses recorded since the last call (at each flush)."""
        if self._gc is not None:
            self._gc.draw()

    def stop_driver_gc(self) -> None:
        """Stop recording the driver's GC (tracing stopped after an error; the run's end
        does it itself)."""
        if self._gc is not None:
            self._gc.stop()

    def lost(self, task_id: str, why: str) -> None:
        """A task's measurements will never arrive (counted on the execution slice at the end)."""
        self.lost_measurements += 1
        self.writer.instant(
            self.loop, L.INSTANT_METRICS_LOST, category=L.CAT_SCHEDULER,
            args={L.ARG_TASK_ID: task_id, L.ARG_REASON: why},
        )

    # ------------------------------------------------------------ tasks

    def task_created(
        self,
        cls: type[_T],
        task_id: str,
        stage_id: Any,
        request: ResourceRequest,
        ts: int,
        *,
        instructions: str | None = None,
        stage_name: str | None = None,
        attempt: int = 0,
        args: dict[str, Any] | None = None,
    ) -> _T:
        """A task left the plan at ``ts``: its slice begins on a free lane; a ``cls`` to keep.

        The stage is named ``stage_name``, else ``instructions``, the first time
        it is seen. ``attempt`` > 0: the runner created the task id again.
        ``args``: more annotations of the task's slice (the producer's own).
        """
        stage = self.stages.for_new_task(stage_id, stage_name or instructions, ts)
        stage.tasks += 1
        stage.outstanding += 1
        stage.requests.append(int(request.memory_bytes or 0))
        flow = self.stages.launched(stage, task_id, ts)
        free = self._free_lanes
        lane = free.pop()[0] if free and free[-1][1] < ts else self._new_lane()
        task = cls(task_id, stage_id, lane, flow, request)
        task.attempt = attempt
        task.created_ts = ts
        begin_args: dict[str, Any] = {
            L.ARG_TASK_ID: task_id,
            L.ARG_STAGE_ID: stage_id,
            L.ARG_STAGE: stage.name,
            L.ARG_RESOURCE_REQUEST: self._request_args(request),
        }
        if instructions:
            begin_args[L.ARG_INSTRUCTIONS] = instructions
        if attempt:
            begin_args[L.ARG_ATTEMPT] = attempt
        if args:
            begin_args.update(args)
        self.writer.begin(lane, stage.name, ts, category=L.CAT_TASK, args=begin_args)
        return task

    def _new_lane(self) -> Track:
        return self.writer.track(L.TASK_LANE, parent=self._tasks_root, rank=0)

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

    def task_dispatched(self, task: TimelineTask, ts: int) -> None:
        """Submitted to Ray: its ``dispatched`` slice begins; it holds its request from now."""
        task.dispatch_ts = ts
        self.writer.begin(task.lane, L.SLICE_DISPATCHED, ts, category=L.CAT_TASK)
        self.counters.hold(task.request)

    def task_ended(self, task: TimelineTask, ts: int, args: dict[str, Any] | None) -> None:
        """The runner is done with the task (received, failed, cancelled...): its slices end."""
        w = self.writer
        if task.dispatch_ts is not None:
            w.end(task.lane, ts)
        w.end(task.lane, ts, args=args)
        task.end_ts = ts
        self.release(task, ts)
        stage = self.stages.get(task.stage_id)
        if stage is not None:
            stage.outstanding -= 1
            stage.last_ts = max(stage.last_ts, ts)

    def release(self, task: TimelineTask, ts: int) -> None:
        """The task no longer holds its lane nor its share of the cluster's resources.

        For a task seen done at ``ts`` whose slices are ended later (at ``ts``).
        """
        if task.released:
            return
        task.released = True
        self._free_lanes.append((task.lane, ts))
        if task.dispatch_ts is not None:
            self.counters.give_back(task.request)

    # ------------------------------------------------------------ executions

    def late_batch(self) -> AbstractContextManager[None]:
        """Around a batch of late facts (executions received, Ray's events): written sorted.

        Executions are drawn when the runner receives their tasks, Ray's
        events a second or more after the tasks ran: behind the rest of the
        trace. Sorted, they go on the writer's second delta clock
        (:meth:`~tracer.format.TraceWriter.in_time_order`) at 1-2 bytes a
        timestamp rather than an absolute one each (~5 bytes compressed): a
        level-1 trace of 2000 no-op tasks is ~30% smaller.
        """
        return self.writer.in_time_order()

    def execution(self, m: Measurements, task: TimelineTask | None) -> None:
        """One execution on its worker's track; the first of a task takes the stage's arrow.

        ``task`` is the task it executed, when known; otherwise ``m`` names it
        (``task_id``, ``stage_id``). Measurements without a start are ignored.
        """
        start = int(m.get("start_ns") or 0)
        end = max(int(m.get("end_ns") or start), start)  # a wall clock stepped back: 0 long
        if not start:
            return
        stage_id: Any
        if task is not None:
            task_id, stage_id = task.task_id, task.stage_id
        else:
            task_id, stage_id = str(m.get("task_id", "?")), m.get("stage_id")
        stage = self.stages.get(stage_id) if stage_id is not None else None
        args: dict[str, Any] = {L.ARG_TASK_ID: task_id}
        if task is not None and task.flow and start < task.created_ts:
            # Its arrow starts at the launch: drawn from there (see the layout's doc).
            args[L.ARG_STARTED_BEFORE_LAUNCH] = task.created_ts - start
            start = task.created_ts
            if end < start:
                end = start
        nodes = self.nodes
        node = nodes.node(str(m.get("node_id") or "unknown"))
        worker = nodes.worker(node, int(m.get("pid") or 0) or 1)
        track = nodes.execution_track(worker, start, end)
        if m.get("ray_task_id"):
            args[L.ARG_RAY_TASK_ID] = m["ray_task_id"]
        if m.get("assigned_resources"):
            args[L.ARG_ASSIGNED_RESOURCES] = {
                k: number(v) for k, v in m["assigned_resources"].items()
            }
        if m.get("attempt"):
            args[L.ARG_RAY_ATTEMPT] = int(m["attempt"])
        args.update(self._memory_args(m, task, stage, node.track, worker.track, start, end))
        error_type = m.get("error_type")
        cancelled = error_type in CANCEL_ERRORS
        if error_type:
            args[L.ARG_STATUS] = L.STATUS_CANCELLED if cancelled else L.STATUS_FAILED
            args[L.ARG_ERROR_TYPE] = error_type
            args[L.ARG_ERROR] = m.get("error", "")
        flows = None
        if task is not None and task.flow:
            flows = [task.flow]
            task.flow = 0  # a retried task's later attempts: no second arrow
        name = stage.name if stage is not None else "task"
        self.writer.begin(
            track, name, start, category=L.CAT_EXECUTION, args=args, terminating_flows=flows
        )
        self.writer.end(track, end)
        if self._ray.enabled:
            self._ray.expect(
                str(m.get("ray_task_id") or ""), int(m.get("attempt") or 0), task, task_id,
                worker, name, end,
            )
        if error_type:
            self.writer.instant(
                track, L.INSTANT_TASK_CANCELLED if cancelled else L.INSTANT_TASK_FAILED, end,
                category=L.CAT_EXECUTION,
                args={L.ARG_TASK_ID: task_id, L.ARG_ERROR_TYPE: error_type},
            )

    def _memory_args(
        self,
        m: Measurements,
        task: TimelineTask | None,
        stage: Stage | None,
        node: Track,
        worker: Track,
        start: int,
        end: int,
    ) -> dict[str, Any]:
        """Requested vs actual memory of one execution; queues its memory counter samples.

        The request is what Ray reserved for the execution (its ``memory=``, in the
        resources the execution reports) wherever that is known, since that is what
        Ray scheduled by: a runner whose ``ResourceRequest`` says otherwise passed
        Ray something else, and judging the task by a figure Ray never saw would
        flag the wrong tasks. The runner's own figure is kept beside it
        (``memory_requested_by_runner``), the task and its stage take Ray's from
        then on, and the first such task is logged.
        """
        requested = int(task.request.memory_bytes or 0) if task is not None else None
        by_runner = None
        if task is not None and requested is not None and self.adopt_ray_reservation:
            reserved = _reserved_memory(m)
            if reserved is not None and reserved != requested:
                by_runner = requested
                self._request_differs(task, stage, requested, reserved)
                requested = reserved
        args, peak, over = self.memory.execution(m, requested, node, worker, start, end)
        if by_runner is not None:
            args[L.ARG_MEMORY_REQUESTED_BY_RUNNER] = by_runner
        if m.get("memray") == L.MEMRAY_PER_TASK:
            self.memray_per_task += 1
            if self.memray_per_task_reason is None:
                self.memray_per_task_reason = str(m.get("memray_reason") or "")[:200]
        if stage is not None and peak is not None:
            stage.peaks.append(peak)
            stage.over_request += over
        return args

    def _request_differs(
        self, task: TimelineTask, stage: Stage | None, runner: int, reserved: int
    ) -> None:
        """Ray reserved ``reserved`` bytes for ``task``, created with ``runner``."""
        task.request = dataclasses.replace(task.request, memory_bytes=reserved)
        if task.dispatch_ts is not None and not task.released:  # it holds Ray's from now
            self.counters.memory_held_differs(reserved - runner)
        if stage is not None:
            stage.request_fixes.append((runner, reserved))
        self.request_mismatches += 1
        if self.request_mismatches == 1:
            logger.warning(
                "tracer: task %r (stage %r) was created with a memory request of %d bytes, "
                "but Ray reserved %d for it (the memory= it was given); the trace's "
                "memory_requested is what Ray reserved, the runner's figure is kept as "
                "%s. Give Ray the ResourceRequest's memory (or task_created Ray's); "
                "the run's end counts such tasks (%s)",
                task.task_id, self.stage_name(task), runner, reserved,
                L.ARG_MEMORY_REQUESTED_BY_RUNNER, L.ARG_MEMORY_REQUEST_MISMATCHES,
            )

    def locate(self, node_id: str | None, pid: int) -> Track:
        """The track of a worker (or node) named by a failure: see :meth:`Nodes.locate`."""
        return self.nodes.locate(node_id, pid)

    def task_killed(
        self, task: TimelineTask, node_id: str | None, ts: int, used: int | None
    ) -> None:
        """Ray's OOM killer killed ``task`` on that node, seen at ``ts``, its worker having
        used ``used`` (or at least that: see ``ARG_MEMORY_AT_KILL``): the node's memory
        counters count its request and that use from its dispatch to the kill (where it
        ran is not known closer), so the node's over-subscription shows where it died."""
        if node_id is None:
            return
        node = self.nodes.node(node_id)
        start = task.dispatch_ts if task.dispatch_ts is not None else ts
        self.memory.killed(node.track, start, ts, int(task.request.memory_bytes or 0),
                           int(used or 0))

    def workers_killed(self, node_id: str | None, pids: Iterable[int], ts: int) -> None:
        """Ray killed these workers of that node (its OOM report names them) by ``ts``:
        the memory counters of those the trace shows drop to 0 there."""
        node = self.nodes.by_id.get(node_id or "")
        if node is None:
            return
        for pid in pids:
            worker = node.workers.get(pid)
            if worker is not None:
                self.memory.worker_gone(worker.track, ts)

    def mark(self, track: Track, name: str, ts: int, args: dict[str, Any]) -> None:
        """A task failed or was cancelled there (``track``: :meth:`locate`'s, or the loop)."""
        self.writer.instant(track, name, ts, category=L.CAT_EXECUTION, args=args)

    def settle(self, watermark: int | None) -> None:
        """Write memory counters up to ``watermark``: no execution still to come starts
        before it (None: all, at the end), nor any awaited from Ray's events."""
        since = self._awaited.since()
        if since is not None and (watermark is None or since < watermark):
            watermark = since
        if self._ray.enabled:
            due = self._ray.attempts_since(self.writer.now())
            if due is not None and (watermark is None or due < watermark):
                watermark = due  # (their node memory steps start after the dispatch)
        self.memory.settle(watermark)
        if watermark is not None:
            self.nodes.forget_before(watermark)

    # ------------------------------------------------------------ Ray's events

    def expect_ray_events(self) -> None:
        """A producer will bring Ray's events: executions drawn from now on wait for theirs."""
        self._ray.enabled = True

    def await_execution(
        self, task: TimelineTask, ray_task_id: str, error: tuple[str, str] | None = None
    ) -> None:
        """The task ended; its executions are to be drawn from Ray's events (see .awaited).

        ``error``: it failed so (the exception's class name and message), as the
        producer read it: its last execution says that over Ray's text of it
        (see :meth:`.Awaited.add`). Needs a producer of Ray's events
        (:meth:`expect_ray_events`).
        """
        self._awaited.add(task, ray_task_id, error)

    def expect_ray_states(self, task: TimelineTask, ray_task_id: str) -> None:
        """``task`` ended failed with no execution to draw (its worker killed, crashed or
        lost): Ray's states of its attempts are drawn once read, which say whether and
        when it reached a worker and ran. Needs a producer of Ray's events."""
        self._ray.expect_states(ray_task_id, task, self.stage_name(task))

    def stage_name(self, task: TimelineTask) -> str:
        """The name of ``task``'s stage ("task" for a stage not known)."""
        stage = self.stages.get(task.stage_id)
        return stage.name if stage is not None else "task"

    def ray_events_wanted(self) -> list[str]:
        """Ray task ids whose events are wanted: awaited executions, and drawn executions
        whose Ray events have not been drawn yet."""
        if not self._awaited:
            return self._ray.wanted()
        return list(dict.fromkeys(self._awaited.wanted() + self._ray.wanted()))

    def ray_events_pending(self) -> bool:
        """Are Ray's events of any execution still wanted? (What :meth:`ray_events_wanted`
        would say is not empty, without making the list: asked after every drawn chunk.)"""
        return bool(self._awaited) or self._ray.missing > 0

    def ray_events_probes(self, limit: int = 16) -> list[str]:
        """Of those, the tasks received last and each worker's last execution (see
        :meth:`.RayPhases.probes`)."""
        return list(dict.fromkeys(self._awaited.probes(limit) + self._ray.probes(limit)))

    def ray_events_complete(self, events: list[RayTaskEvents], ray_task_ids: list[str]) -> bool:
        """Would ``events`` bring all that is wanted of each of ``ray_task_ids`` (those
        still wanted)? Nothing is drawn: the close asks this of a few probes, then draws
        everything in one read, in time order (probes drawn first, the worker's later
        executions, would push its earlier ones onto a second lane of Ray's phases)."""
        wanted = set(ray_task_ids) & set(self.ray_events_wanted())
        ready = self._ray.complete_ids(events)  # drawn executions: their phases are in
        if self._awaited:  # executions still to draw: every attempt of theirs is settled
            ready |= self._awaited.settled_ids(events)
        return wanted <= ready

    def ray_events(
        self, events: list[RayTaskEvents], *, final: bool = False, dropped_by_ray: int = 0
    ) -> int:
        """Draw Ray's events of drawn executions (see :mod:`.ray_phases`); how many completed.

        ``final``: the last call, draw what there is. ``dropped_by_ray``: the
        count of events Ray says it dropped, said on the execution slice.
        """
        self._ray.dropped_by_ray = max(self._ray.dropped_by_ray, dropped_by_ray)
        with self.late_batch():  # a second or more late
            if self._awaited:
                for task, attempts in self._awaited.settle(events, final):
                    self._draw_awaited(task, attempts)
            return self._ray.draw(events, final)

    def _draw_awaited(self, task: TimelineTask, attempts: list[RayTaskEvents]) -> None:
        """The executions of an awaited task, one per attempt that ran a body; a mark
        where an attempt failed without one (its worker killed); then, with no execution
        at all, its attempts' states."""
        drawn = False
        for i, ev in enumerate(attempts, 1):
            m = measurements(ev)
            if m is not None:
                self.execution(m, task)  # its phases are drawn with it (expected now)
                drawn = True
            elif i < len(attempts):  # Ray ran it again
                self._attempt_failed(task, task.task_id, self.stage_name(task), ev, False)
            elif ev.failed_at is not None and ev.ran and (ev.worker_pid or ev.node_id):
                cancelled = ev.error_type in CANCEL_ERRORS
                self.mark(
                    self.locate(ev.node_id or None, ev.worker_pid),
                    L.INSTANT_TASK_CANCELLED if cancelled else L.INSTANT_TASK_FAILED,
                    ev.failed_at,
                    {L.ARG_TASK_ID: task.task_id, L.ARG_ERROR_TYPE: ev.error_type,
                     L.ARG_ERROR: ev.error},
                )
        if not drawn:
            self._ray.draw_attempts_states(
                task, self.stage_name(task), sorted(attempts, key=lambda ev: ev.attempt))
        stage = self.stages.get(task.stage_id)
        if stage is not None and stage.done and not self._awaited.waiting_in(task.stage_id):
            self.stages.write(stage)

    def _attempt_failed(
        self, task: TimelineTask | None, task_id: str, name: str, ev: RayTaskEvents,
        last: bool,
    ) -> None:
        """An attempt of ``task`` failed (Ray's events ``ev``) and Ray ran the task again:
        a ``task failed`` mark where it failed (``retried``; with Ray's OOM report where it
        was killed for memory), and a ``failed attempt`` slice on its worker from when it
        ran, where Ray's events say it ran; the workers Ray killed then leave the memory
        counters. Without this, a kill that Ray retried was nowhere but in the task's
        attempt count: not in the OOM reports, the kill counts nor the suggestions.
        ``last``: the attempt the task failed with, which the producer marked already
        (from the error it received): its slice only, where it ran."""
        failed_at = ev.failed_at
        if failed_at is None:
            return
        if last:
            self._failed_attempt_slice(name, ev, failed_at, {
                L.ARG_TASK_ID: task_id, L.ARG_RAY_ATTEMPT: ev.attempt,
                L.ARG_ERROR_TYPE: ev.error_type, L.ARG_ERROR: ev.error})
            return
        node_id = ev.node_id or None
        if node_id is None and not ev.worker_pid:
            track = self.loop
        else:
            track = self.locate(node_id, ev.worker_pid)
        args: dict[str, Any] = {
            L.ARG_TASK_ID: task_id, L.ARG_RAY_ATTEMPT: ev.attempt, L.ARG_RETRIED: True,
            L.ARG_ERROR_TYPE: ev.error_type, L.ARG_ERROR: ev.error,
        }
        requested = int(task.request.memory_bytes or 0) if task is not None else 0
        if requested:
            args[L.ARG_MEMORY_REQUESTED] = requested
        if ev.oom_used:
            args[L.ARG_MEMORY_AT_KILL] = ev.oom_used
        ran_from = self._failed_attempt_slice(name, ev, failed_at, args)
        with self.late_batch():  # a second or more late
            mark = dict(args)
            if ev.oom_top:
                mark[L.ARG_OOM_TOP_MEMORY_USERS] = [
                    {"pid": pid, "memory": used, "command": command}
                    for pid, used, command in ev.oom_top
                ]
            self.mark(track, L.INSTANT_TASK_FAILED, failed_at, mark)
        gone = [pid for pid, _ in ev.oom_killed]
        if ev.worker_pid and ev.error_type in _WORKER_GONE:
            gone.append(ev.worker_pid)
        if gone:
            self.workers_killed(node_id, gone, failed_at)
        if node_id is not None and (ev.oom_used or requested):
            # The node's counters hold its request and its memory at the kill while it ran
            # (as for a task killed for good): the memory that got it killed shows there.
            start = ran_from if ran_from is not None else (
                task.dispatch_ts if task is not None and task.dispatch_ts is not None
                else failed_at)
            self.memory.killed(self.nodes.node(node_id).track, min(start, failed_at),
                               failed_at, requested, ev.oom_used)

    def _failed_attempt_slice(
        self, name: str, ev: RayTaskEvents, failed_at: int, args: dict[str, Any]
    ) -> int | None:
        """The ``failed attempt`` slice of ``ev`` on its worker, from when Ray's events say
        it ran until it failed (none where they do not say); when it ran."""
        ran_from = next((ts for state, ts in ev.states if state == L.STATE_RUNNING), None)
        node_id = ev.node_id or None
        if ran_from is not None and ev.worker_pid and node_id is not None:
            node = self.nodes.node(node_id)
            worker = self.nodes.worker(node, ev.worker_pid)
            start, end = min(ran_from, failed_at), failed_at
            with self.late_batch():  # a second or more late
                self.writer.complete(
                    self.nodes.execution_track(worker, start, end),
                    L.SLICE_FAILED_ATTEMPT_PREFIX + name, start, end,
                    category=L.CAT_ATTEMPT, args=args,
                )
        return ran_from

    # ------------------------------------------------------------ actor pools

    def actor_starting(
        self, stage_id: Any, stage_name: str | None, ts: int, args: dict[str, Any] | None = None
    ) -> ActorStart:
        """The engine created an actor of the stage's pool at ``ts``: its ``actor starting``
        slice begins on one of the stage's ``actors starting`` lanes (under the stage's
        track, declared now if its first task is still to come); :meth:`actor_started`
        ends it. An actor created before the run began (as its operator started) is drawn
        from the run's start, ``began_before_run_ns`` saying by how much. ``args``: more
        annotations (``actor_id``)."""
        return self._actors.starting(stage_id, stage_name, ts, args)

    def actor_started(
        self, start: ActorStart, ts: int, args: dict[str, Any] | None = None
    ) -> None:
        """The actor ``start`` is ready at ``ts`` (or, with ``args``' ``status``, never will
        be: failed, released, unfinished): its slice ends (once)."""
        self._actors.started(start, ts, args)

    # ------------------------------------------------------------ stages, end

    def stage_done(self, stage_id: Any) -> None:
        """Write the stage's slice and arrows now (the producer knows no more will come)."""
        stage = self.stages.get(stage_id)
        if stage is None:
            return
        stage.done = True
        if not self._awaited.waiting_in(stage_id):  # else once its last one is drawn
            self.stages.write(stage)

    def close(self, args: dict[str, Any] | None = None) -> None:
        """The run ended: :meth:`finish`, :meth:`end_run` and :meth:`ray_events_read`, now."""
        self.finish()
        ts = self.writer.now()
        self.end_run(ts, args)
        self.ray_events_read(ts)

    def finish(self) -> None:
        """The run ended: every stage, the last memory counters; but for what awaits
        executions from Ray's events (:meth:`ray_events_read` writes it)."""
        for stage in list(self.stages.by_id.values()):
            if not self._awaited.waiting_in(stage.stage_id):
                self.stages.write(stage)
        self.settle(None)

    def end_run(self, ts: int | None, args: dict[str, Any] | None = None) -> None:
        """The end of the run's slice at ``ts`` (now if None), with ``lost_measurements``
        and ``args``."""
        end_args: dict[str, Any] = {L.ARG_LOST_MEASUREMENTS: self.lost_measurements}
        if self.request_mismatches:
            end_args[L.ARG_MEMORY_REQUEST_MISMATCHES] = self.request_mismatches
        if self.memray_per_task:
            end_args[L.ARG_MEMRAY_PER_TASK] = self.memray_per_task
            end_args[L.ARG_MEMRAY_PER_TASK_REASON] = self.memray_per_task_reason or ""
        if self._gc is not None:
            end_args.update(self._gc.totals())
        self.writer.end(self.loop, ts, args={**end_args, **(args or {})})

    def ray_events_read(self, ts: int | None, source: str | None = None) -> None:
        """The producer of Ray's events is done: how many executions lack them, how
        many events Ray says it dropped, and where they were read (``source``), on an
        instant at ``ts`` (the run's end).

        Not on the run's slice: Ray's last events come after the run's end, and
        the run's slice ends when the run does (a producer reads them after).
        """
        # What waited for executions from Ray's events is written now, with or without them.
        self._awaited.give_up()
        self._ray.give_up_attempts()
        self.finish()
        if self._ray.enabled:
            args: dict[str, int | str] = {
                L.ARG_RAY_EVENTS_MISSING: self._ray.missing + self._awaited.missing,
                L.ARG_RAY_EVENTS_DROPPED: self._ray.dropped_by_ray,
            }
            if self._awaited.missing:
                args[L.ARG_EXECUTIONS_MISSING] = self._awaited.missing
            if source is not None:
                args[L.ARG_RAY_EVENTS_SOURCE] = source
            self.writer.instant(
                self.loop, L.INSTANT_RAY_EVENTS, ts, category=L.CAT_SCHEDULER, args=args
            )


def _reserved_memory(m: Measurements) -> int | None:
    """The memory Ray reserved for an execution, from the resources it reports; None
    where they are not reported (an engine's own measurements, a failed read)."""
    resources = m.get("assigned_resources")
    if not isinstance(resources, dict):
        return None
    try:
        return int(float(resources.get("memory") or 0))
    except (TypeError, ValueError):
        return None

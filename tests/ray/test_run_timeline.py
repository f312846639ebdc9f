"""The run timeline on its own: any producer draws a run with plain facts, no Ray needed."""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from engines_agree import assert_engines_agree

from tracer.cli import main
from tracer.format import TraceWriter, read_trace
from tracer.query import QueryConfig, TraceQuery
from tracer.ray import ResourceRequest, TracingLevel
from tracer.ray import layout as L
from tracer.ray.timeline import RunTimeline, TimelineTask

T0 = 1_800_000_000_000_000_000
MS = 1_000_000
MIB = 1 << 20
TIMELINE = Path(__file__).resolve().parents[2] / "tracer" / "ray" / "timeline"


def test_the_timeline_knows_nothing_of_ray() -> None:
    """Its modules import the format layer and the layout's names, never Ray nor producers.

    The one recorder it owns, of the driver's own GC (``tracer.ray.driver_gc``), is
    Python's alone: it imports nothing of Ray's nor of tracer's.
    """
    allowed = {
        "tracer.format", "tracer.ray.layout", "tracer.ray.levels", "tracer.ray.resources",
        "tracer.stats", "tracer.ray.driver_gc",
    }
    driver_gc = TIMELINE.parent / "driver_gc.py"
    for path in [*sorted(TIMELINE.glob("*.py")), driver_gc]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("tracer", "tracer.ray"):
                names = [f"{node.module}.{alias.name}" for alias in node.names]  # a submodule
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.startswith(("ray", "tracer")):
                    assert path != driver_gc, f"{path.name} imports {name}"
                    assert name in allowed or name.startswith("tracer.ray.timeline"), (
                        f"{path.name} imports {name}"
                    )


def _measured(start: int, node: str, pid: int, peak: int) -> dict[str, object]:
    return {"start_ns": start, "end_ns": start + 10 * MS, "node_id": node, "pid": pid,
            "heap_peak": peak, "rss_peak": 100 * MIB, "allocations": 3}


def test_a_producer_draws_a_run_with_facts(tmp_path: Path) -> None:
    path = tmp_path / "facts.perfetto-trace"
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="facts", runner_name="engine", level=TracingLevel.MEMORY,
                         cluster_resources={"CPU": 2.0, "memory": 4.0 * (1 << 30)},
                         loop_pid=77, loop_tid=77)
        request = ResourceRequest(num_cpus=1, memory_bytes=4 * MIB)
        tl.begin_loop(L.SLICE_WAVE, {L.ARG_WAVE: 0})
        tasks = []
        for i, node in enumerate(["n" * 40, "m" * 40]):
            task = tl.task_created(TimelineTask, f"t{i}", 0, request, T0 + i * MS,
                                   stage_name="map")
            tl.task_dispatched(task, T0 + 2 * MS)
            tasks.append((task, node))
        tl.count_inflight(2)
        tl.end_loop({L.ARG_TASKS_DISPATCHED: 2})
        for i, (task, node) in enumerate(tasks):
            tl.execution(_measured(T0 + 3 * MS, node, 500 + i, (2 + 4 * i) * MIB), task)
            tl.task_ended(task, T0 + 20 * MS, None)
        failed = tl.task_created(TimelineTask, "t2", 0, request, T0 + 21 * MS)
        tl.task_ended(failed, T0 + 22 * MS, {L.ARG_STATUS: L.STATUS_FAILED})
        tl.mark(tl.locate("n" * 40, 501), L.INSTANT_TASK_FAILED, T0 + 22 * MS,
                {L.ARG_TASK_ID: "t2"})
        tl.lost("t3", "never came")
        tl.stage_done(0)
        tl.close()

    model = read_trace(path, strict=True)
    names = {t.name for t in model.tracks.values()}
    assert {"Scheduler (engine)", L.DISPATCH_LOOP_THREAD, L.TASKS_TRACK, L.STAGES_TRACK,
            "0: map", "worker 500", "worker 501", L.COUNTER_NODE_MEMORY_USED} <= names
    assert {n for n in names if n and n.startswith(L.NODE_PROCESS_PREFIX)} == {
        "Node 0 (nnnnnnnn)", "Node 1 (mmmmmmmm)"}
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    assert [e.name for e in executions] == ["map", "map"]
    assert [e.args.get(L.ARG_OVER_REQUEST) for e in executions] == [None, True]
    (stage,) = [s for s in model.slices if s.category == L.CAT_STAGE]
    assert stage.args[L.ARG_TASKS_OVER_REQUEST] == 1
    # The arrows leave the stage's track at each task's creation (a mark nested in the
    # stage's slice), not at the slice's end.
    launches = {i.id: i for i in model.instants if i.name == L.INSTANT_TASK_LAUNCHED}
    assert sorted((launches[f.source_id].ts - T0, f.dest_id) for f in model.flows) == sorted(
        (i * MS, e.id) for i, e in enumerate(executions))
    assert {i.parent_id for i in launches.values()} == {stage.id}
    assert len(launches) == 3  # t2 (failed, never ran) was launched too: no arrow

    # Top-down: one root holding the scheduler, tasks, stages, then the nodes in the order
    # seen; each node its memory counters on one scale, then its workers by real pid.
    tracks = model.tracks.values()
    (root,) = model.children(None)
    assert root.name == "Run facts"

    def ordered(parent: int) -> list[str | None]:
        return [t.name for t in sorted(model.children(parent),
                                       key=lambda t: t.sibling_order_rank or 0)]

    assert ordered(root.uuid) == ["Scheduler (engine)", L.TASKS_TRACK, L.STAGES_TRACK,
                                  "Node 0 (nnnnnnnn)", "Node 1 (mmmmmmmm)"]
    (scheduler,) = [t for t in tracks if t.name == "Scheduler (engine)"]
    assert ordered(scheduler.uuid)[0] == L.DISPATCH_LOOP_THREAD
    (node1,) = [t for t in tracks if t.name == "Node 1 (mmmmmmmm)"]
    assert ordered(node1.uuid) == [L.COUNTER_NODE_MEMORY_REQUESTED, L.COUNTER_NODE_MEMORY_USED,
                                   "worker 501"]
    assert {t.y_axis_share_key for t in model.children(node1.uuid) if t.kind == "counter"} == {
        L.NODE_MEMORY_AXIS}
    (worker,) = [t for t in model.children(node1.uuid) if t.name == "worker 501"]
    assert ordered(worker.uuid) == [L.COUNTER_WORKER_RSS, L.COUNTER_WORKER_HEAP]
    assert not [t for t in tracks if t.kind in ("process", "thread")]
    (run,) = [s for s in model.slices if s.name == L.SLICE_EXECUTION]
    assert run.args[L.ARG_LOST_MEASUREMENTS] == 1
    with TraceQuery(path, QueryConfig(engine="reader")) as q:
        summary = q.stage_summary()
    assert list(summary["stage"]) == ["map"] and list(summary["tasks"]) == [3]
    assert_engines_agree(path)


def test_counters_a_scheduler_reports_itself(tmp_path: Path) -> None:
    """Per-stage tasks in flight, object-store memory, resources left (Ray Data's figures)."""
    path = tmp_path / "counters.perfetto-trace"
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="c", runner_name="engine", loop_pid=5, loop_tid=5)
        task = tl.task_created(TimelineTask, "t0", 3, ResourceRequest(), T0, stage_name="map")
        tl.count_stage_inflight(3, 1)
        tl.count_stage_inflight(3, 1)  # unchanged: not written again
        tl.sample_available(cpus=1.5, object_store_memory=10 * MIB)
        tl.count_object_store_used(2 * MIB)
        tl.execution({"start_ns": T0 + MS, "end_ns": T0 + 2 * MS, "node_id": "n" * 40,
                      "pid": 9, "rss_peak": 200 * MIB, "uss_peak": 120 * MIB}, task)
        tl.task_ended(task, T0 + 3 * MS, None)
        other = tl.task_created(TimelineTask, "t1", 3, ResourceRequest(), T0 + 3 * MS,
                                stage_name="map")
        tl.execution({"start_ns": T0 + 4 * MS, "end_ns": T0 + 5 * MS, "node_id": "n" * 40,
                      "pid": 9, "rss_peak": 100 * MIB, "uss_peak": 150 * MIB}, other)
        tl.task_ended(other, T0 + 6 * MS, None)
        tl.count_stage_inflight(3, 0)
        tl.sample_available(cpus=2, object_store_memory=12 * MIB)
        tl.close()
    model = read_trace(path, strict=True)
    by_name = {t.name: t for t in model.tracks.values() if t.kind == "counter"}
    values = {name: [c.value for c in model.counters_on(t.uuid)] for name, t in by_name.items()}
    stage = L.COUNTER_STAGE_INFLIGHT.format(stage="3: map")
    assert values[stage] == [1, 0]
    assert values[L.COUNTER_AVAILABLE_CPUS] == [1.5, 2]
    assert values[L.COUNTER_AVAILABLE_OBJECT_STORE] == [10 * MIB, 12 * MIB]
    assert values[L.COUNTER_OBJECT_STORE_USED] == [2 * MIB]
    assert L.COUNTER_AVAILABLE_GPUS in by_name and not values[L.COUNTER_AVAILABLE_GPUS]
    scheduler = model.parent_of(by_name[stage].uuid)
    assert scheduler is not None and scheduler.name == "Scheduler (engine)"
    # Without a heap peak, the execution's actual memory is the larger of the engine's
    # USS peak (Ray Data samples it once a second) and the worker's private RSS peak.
    e, e2 = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    assert (e.args[L.ARG_MEMORY_PEAK], e.args[L.ARG_USS_PEAK]) == (200 * MIB, 120 * MIB)
    assert e2.args[L.ARG_MEMORY_PEAK] == e2.args[L.ARG_USS_PEAK] == 150 * MIB
    with TraceQuery(path, QueryConfig(engine="reader")) as q:
        assert list(q.task_latency()["peak_source"]) == ["rss", "uss"]
    assert_engines_agree(path)


def test_a_runner_that_dispatches_past_the_cluster(tmp_path: Path) -> None:
    """Daft keeps ~90 tasks a CPU in flight and counts none itself: available CPUs stay
    at 0 (not -3), and the timeline's own count of tasks in flight shows the backlog,
    until the runner counts them itself."""
    path = tmp_path / "backlog.perfetto-trace"
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="b", runner_name="daft-like", loop_pid=5, loop_tid=5,
                         cluster_resources={"CPU": 2.0})
        tasks = [tl.task_created(TimelineTask, f"t{i}", 0, ResourceRequest(num_cpus=1),
                                 T0 + i, stage_name="map") for i in range(5)]
        for i, task in enumerate(tasks):
            tl.task_dispatched(task, T0 + 10 + i)
        tl.sample_resources()
        for i, task in enumerate(tasks[:4]):
            tl.task_ended(task, T0 + MS + i, None)
        tl.sample_resources()
        tl.count_inflight(7)  # the runner's own count: the only one from now on
        tl.sample_resources()
        tl.task_ended(tasks[4], T0 + 2 * MS, None)
        tl.sample_resources()
        tl.close()
    model = read_trace(path, strict=True)
    by_name = {t.name: t for t in model.tracks.values() if t.kind == "counter"}
    values = {name: [c.value for c in model.counters_on(t.uuid)] for name, t in by_name.items()}
    assert values[L.COUNTER_AVAILABLE_CPUS] == [2, 0, 1, 2]
    assert values[L.COUNTER_INFLIGHT] == [5, 1, 7]



def states_of(model: Any, task_id: str) -> tuple[Any, list[Any]]:
    """The ``ray states <stage>`` slice of ``task_id`` and Ray's states nested in it."""
    (head,) = [s for s in model.slices if (s.name or "").startswith(L.RAY_STATES_PREFIX)
               and s.args.get(L.ARG_TASK_ID) == task_id]
    assert model.tracks[head.track_uuid].name == L.RAY_STATES_TRACK
    assert head.category == L.CAT_RAY and head.depth == 0
    return head, sorted((s for s in model.slices if s.parent_id == head.id), key=lambda s: s.ts)


def test_ray_events_are_drawn_where_the_execution_was(tmp_path: Path) -> None:
    """Ray's phases nest on the worker's 'Ray phases' track, its states on the lane's 'Ray
    states' track within 'dispatched'; a state timed outside that slice is clamped into it;
    what never came is counted."""
    from tracer.ray.timeline import RayTaskEvents

    path = tmp_path / "ray-events.perfetto-trace"
    request = ResourceRequest(num_cpus=1)
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="rayev", loop_pid=77, loop_tid=77)
        tl.expect_ray_events()
        a = tl.task_created(TimelineTask, "a", 0, request, T0, stage_name="map")
        b = tl.task_created(TimelineTask, "b", 0, request, T0, stage_name="map")
        for task in (a, b):
            tl.task_dispatched(task, T0 + 1 * MS)
        measured = {"start_ns": T0 + 5 * MS, "end_ns": T0 + 9 * MS, "node_id": "n" * 40,
                    "pid": 500, "ray_task_id": "aa"}
        tl.execution(measured, a)
        tl.task_ended(a, T0 + 12 * MS, None)
        tl.execution({**measured, "ray_task_id": "bb", "pid": 501}, b)
        tl.task_ended(b, T0 + 12 * MS, None)
        assert sorted(tl.ray_events_wanted()) == ["aa", "bb"]
        states = ((L.STATE_PENDING_ARGS, T0), (L.STATE_PENDING_NODE, T0 + 2 * MS),
                  (L.STATE_SUBMITTED, T0 + 3 * MS), (L.STATE_RUNNING, T0 + 4 * MS),
                  (L.STATE_FINISHED, T0 + 11 * MS))
        phases = ((L.PHASE_DESERIALIZE, T0 + 4 * MS, T0 + 5 * MS),
                  (L.PHASE_EXECUTE, T0 + 5 * MS, T0 + 9 * MS),
                  (L.PHASE_STORE_OUTPUTS, T0 + 9 * MS, T0 + 10 * MS))
        ev_a = RayTaskEvents("aa", 0, "map_fn", "n" * 40, 500, states,
                             (T0 + 4 * MS, T0 + 10 * MS), phases)
        not_yet = RayTaskEvents("bb", 0, "map_fn", "n" * 40, 501, states[:2])
        unknown = RayTaskEvents("cc", 0, "other", "n" * 40, 500, states, (T0, T0 + MS), ())
        assert tl.ray_events([ev_a, not_yet, unknown], dropped_by_ray=3) == 1
        assert tl.ray_events_wanted() == ["bb"]  # asked for again: its worker's part is late
        assert tl.ray_events([not_yet], final=True) == 0  # the close: states drawn, still missing
        tl.close()

    model = read_trace(path, strict=True)
    track_names = {t.uuid: t.name for t in model.tracks.values()}
    ray_tracks = {u for u, n in track_names.items()
                  if n in (L.RAY_PHASES_TRACK, L.RAY_STATES_TRACK)}
    ray_slices = [s for s in model.slices if s.track_uuid in ray_tracks]
    assert all(s.category == L.CAT_RAY for s in ray_slices)
    spans = [s for s in ray_slices if (s.name or "").startswith(L.RAY_TASK_PREFIX)]
    assert [(s.name, s.ts, s.dur, s.args[L.ARG_TASK_ID]) for s in spans] == [
        ("ray task map_fn", T0 + 4 * MS, 6 * MS, "a")]
    assert track_names[spans[0].track_uuid] == L.RAY_PHASES_TRACK
    worker_track = model.tracks[spans[0].track_uuid].parent_uuid
    assert worker_track is not None and track_names[worker_track] == "worker 500"
    nested = sorted(
        (s.ts, s.name) for s in ray_slices if s.depth == 1 and s.track_uuid == spans[0].track_uuid)
    assert [n for _, n in nested] == [L.PHASE_DESERIALIZE, L.PHASE_EXECUTE, L.PHASE_STORE_OUTPUTS]
    assert {s.depth for s in model.slices_on(a.lane.uuid)} == {0, 1}  # the task, dispatched
    # The states: in a slice naming the task, over its 'dispatched' slice, on a 'Ray states'
    # lane beside the tasks' lanes (after them), not under the task's lane.
    head_a, lane_a = states_of(model, "a")
    assert (head_a.name, head_a.ts, head_a.end_ts) == (
        L.RAY_STATES_PREFIX + "map", T0 + 1 * MS, T0 + 12 * MS)
    states_track = model.tracks[head_a.track_uuid]
    assert states_track.parent_uuid == model.tracks[a.lane.uuid].parent_uuid
    assert (states_track.sibling_order_rank, model.tracks[a.lane.uuid].sibling_order_rank) == (1, 0)
    assert model.tracks[states_track.parent_uuid].child_ordering == "explicit"
    # PENDING_ARGS_AVAIL at T0 (before the dispatch at T0 + 1 ms) is clamped into 'dispatched';
    # FINISHED lasts until the task was received (12 ms).
    assert [s.name for s in lane_a] == [L.STATE_PENDING_ARGS, L.STATE_PENDING_NODE,
                                        L.STATE_SUBMITTED, L.STATE_RUNNING, L.STATE_FINISHED]
    assert lane_a[0].ts == T0 + 1 * MS and lane_a[-1].end_ts == T0 + 12 * MS
    head_b, lane_b = states_of(model, "b")
    assert [s.name for s in lane_b] == [L.STATE_PENDING_ARGS, L.STATE_PENDING_NODE]
    # a and b were in flight together: their states on two lanes of one name.
    assert head_b.track_uuid != head_a.track_uuid
    assert model.tracks[head_b.track_uuid].name == L.RAY_STATES_TRACK
    run = next(s for s in model.slices if s.name == L.SLICE_EXECUTION and s.depth == 0)
    (read,) = [i for i in model.instants if i.name == L.INSTANT_RAY_EVENTS]
    assert read.args[L.ARG_RAY_EVENTS_MISSING] == 1
    assert read.args[L.ARG_RAY_EVENTS_DROPPED] == 3
    assert read.ts == run.end_ts and L.ARG_RAY_EVENTS_MISSING not in run.args


def test_a_task_killed_with_no_execution_gets_its_last_attempts_states(tmp_path: Path) -> None:
    """A task that failed with no execution (its worker killed) wants its Ray states alone:
    drawn once its last attempt there has ended (an earlier attempt's end is not enough),
    its attempts' one after another; one whose states never come is counted missing."""
    from tracer.ray.timeline import RayTaskEvents

    path = tmp_path / "killed.perfetto-trace"
    request = ResourceRequest(num_cpus=1)
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="killed", loop_pid=77, loop_tid=77)
        tl.expect_ray_events()
        k = tl.task_created(TimelineTask, "k", 0, request, T0, stage_name="hog")
        lost = tl.task_created(TimelineTask, "lost", 0, request, T0, stage_name="hog")
        for task in (k, lost):
            tl.task_dispatched(task, T0 + 1 * MS)
            tl.task_ended(task, T0 + 30 * MS, {L.ARG_STATUS: L.STATUS_FAILED})
            tl.expect_ray_states(task, task.task_id * 2)
        assert sorted(tl.ray_events_wanted()) == ["kk", "lostlost"]
        first = ((L.STATE_PENDING_NODE, T0 + 2 * MS), (L.STATE_RUNNING, T0 + 3 * MS),
                 (L.STATE_FAILED, T0 + 10 * MS))
        retry = ((L.STATE_PENDING_NODE, T0 + 11 * MS), (L.STATE_SUBMITTED, T0 + 12 * MS),
                 (L.STATE_RUNNING, T0 + 13 * MS))
        attempt0 = RayTaskEvents("kk", 0, "hog", states=first)
        running = RayTaskEvents("kk", 1, "hog", states=retry)
        # Attempt 0 ended, but Ray retried it: not complete until attempt 1 ends.
        assert not tl.ray_events_complete([attempt0, running], ["kk"])
        assert tl.ray_events([attempt0, running]) == 0
        killed = RayTaskEvents("kk", 1, "hog", states=(*retry, (L.STATE_FAILED, T0 + 25 * MS)))
        assert tl.ray_events_complete([attempt0, killed], ["kk"])
        assert tl.ray_events([killed, attempt0]) == 1
        assert tl.ray_events_wanted() == ["lostlost"]
        assert tl.ray_events([], final=True) == 0
        tl.close()

    model = read_trace(path, strict=True)
    head, states = states_of(model, "k")
    assert (head.name, head.ts, head.end_ts) == (
        L.RAY_STATES_PREFIX + "hog", T0 + 1 * MS, T0 + 30 * MS)
    assert [(s.name, s.ts, s.end_ts) for s in states] == [
        (L.STATE_PENDING_NODE, T0 + 2 * MS, T0 + 3 * MS),
        (L.STATE_RUNNING, T0 + 3 * MS, T0 + 10 * MS),
        (L.STATE_FAILED, T0 + 10 * MS, T0 + 11 * MS),  # attempt 0, until Ray retried it
        (L.STATE_PENDING_NODE, T0 + 11 * MS, T0 + 12 * MS),
        (L.STATE_SUBMITTED, T0 + 12 * MS, T0 + 13 * MS),
        (L.STATE_RUNNING, T0 + 13 * MS, T0 + 25 * MS),
        (L.STATE_FAILED, T0 + 25 * MS, T0 + 30 * MS),
    ]
    assert not [s for s in model.slices if s.args.get(L.ARG_TASK_ID) == "lost"
                and (s.name or "").startswith(L.RAY_STATES_PREFIX)]
    (read,) = [i for i in model.instants if i.name == L.INSTANT_RAY_EVENTS]
    assert read.args[L.ARG_RAY_EVENTS_MISSING] == 1


def test_a_task_killed_with_others_takes_the_worker_rays_events_name(tmp_path: Path) -> None:
    """Ray kills two workers of one stage at once and hands both tasks one report naming
    both: each task slice says the least of their memory (a lower bound) and both workers.
    Ray's events name the worker that ran one of them (its states' slice says so): that
    one gets its own worker and memory in both engines; the other keeps the lower bound."""
    from tracer.ray.timeline import RayTaskEvents

    path = tmp_path / "two-killed.perfetto-trace"
    node_id = "n" * 40
    killed = {"11": 100 * MIB, "12": 300 * MIB}
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="kill2", loop_pid=77, loop_tid=77)
        tl.expect_ray_events()
        tasks = [tl.task_created(TimelineTask, t, 0, ResourceRequest(memory_bytes=64 * MIB),
                                 T0, stage_name="hog") for t in ("a", "b")]
        for task in tasks:
            tl.task_dispatched(task, T0 + 1 * MS)
        for task in tasks:
            end_args = {L.ARG_STATUS: L.STATUS_FAILED, L.ARG_ERROR_TYPE: "OutOfMemoryError",
                        L.ARG_MEMORY_AT_KILL: 100 * MIB, L.ARG_OOM_KILLED_WORKERS: killed}
            tl.task_ended(task, T0 + 30 * MS, end_args)
            tl.mark(tl.locate(node_id, 0), L.INSTANT_TASK_FAILED, T0 + 30 * MS,
                    {L.ARG_TASK_ID: task.task_id, L.ARG_MEMORY_AT_KILL: 100 * MIB})
            tl.expect_ray_states(task, task.task_id * 2)
        states = ((L.STATE_SUBMITTED, T0 + 2 * MS), (L.STATE_RUNNING, T0 + 3 * MS),
                  (L.STATE_FAILED, T0 + 20 * MS))
        tl.ray_events([RayTaskEvents("aa", 0, "hog", node_id, 0, states),
                       RayTaskEvents("bb", 0, "hog", node_id, 12, states)])
        tl.close()

    model = read_trace(path, strict=True)
    head_b, _ = states_of(model, "b")
    assert head_b.args[L.ARG_WORKER_PID] == 12
    head_a, _ = states_of(model, "a")
    assert L.ARG_WORKER_PID not in head_a.args
    with TraceQuery(path, QueryConfig(engine="reader")) as q:
        rows = {r["task_id"]: r for r in q.task_latency().to_dict("records")}
        flagged = {r["task_id"]: r for r in q.memory_flagged().to_dict("records")}
    assert (rows["b"]["worker"], flagged["b"]["peak_bytes"]) == ("worker 12", 300 * MIB)
    assert (rows["a"]["worker"], flagged["a"]["peak_bytes"]) == (None, 100 * MIB)
    assert rows["a"]["node"] == rows["b"]["node"] is not None
    assert_engines_agree(path)


def test_ray_events_timed_out_of_place_are_clamped(tmp_path: Path) -> None:
    """Ray times phases and states on its own clocks (another node's, another process's):
    a phase outside the task's span in the worker is clamped into it, one that starts
    before the previous one ended starts at that end; states are clamped into the task's
    'dispatched' slice, and one that would last nothing there is not drawn (Ray's
    FINISHED after the runner received the task, a state followed at once by another)."""
    from tracer.ray.timeline import RayTaskEvents

    path = tmp_path / "clamped.perfetto-trace"
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="clamp", loop_pid=77, loop_tid=77)
        tl.expect_ray_events()
        a = tl.task_created(TimelineTask, "a", 0, ResourceRequest(num_cpus=1), T0,
                            stage_name="map")
        tl.task_dispatched(a, T0 + 1 * MS)
        tl.execution({"start_ns": T0 + 5 * MS, "end_ns": T0 + 9 * MS, "node_id": "n" * 40,
                      "pid": 500, "ray_task_id": "aa"}, a)
        tl.task_ended(a, T0 + 12 * MS, None)
        states = ((L.STATE_PENDING_ARGS, T0),  # before the dispatch
                  (L.STATE_PENDING_NODE, T0 + 3 * MS), (L.STATE_SUBMITTED, T0 + 3 * MS),
                  (L.STATE_RUNNING, T0 + 4 * MS),
                  (L.STATE_FINISHED, T0 + 13 * MS))  # after the runner received it
        phases = ((L.PHASE_DESERIALIZE, T0 + 3 * MS, T0 + 5 * MS),  # starts before the span
                  (L.PHASE_EXECUTE, T0 + 9 * MS // 2, T0 + 9 * MS),  # before the last one ended
                  (L.PHASE_STORE_OUTPUTS, T0 + 9 * MS, T0 + 11 * MS))  # ends after it
        ev = RayTaskEvents("aa", 0, "map_fn", "n" * 40, 500, states,
                           (T0 + 4 * MS, T0 + 10 * MS), phases)
        assert tl.ray_events([ev]) == 1
        tl.close()

    model = read_trace(path, strict=True)
    by_track = {t.uuid: t.name for t in model.tracks.values()}
    phases_drawn = sorted(
        ((s.name, s.ts - T0, s.dur) for s in model.slices
         if by_track[s.track_uuid] == L.RAY_PHASES_TRACK and s.depth == 1),
        key=lambda p: p[1])
    (span,) = [(s.ts - T0, s.dur) for s in model.slices
               if by_track[s.track_uuid] == L.RAY_PHASES_TRACK and s.depth == 0]
    assert span == (4 * MS, 6 * MS)
    assert phases_drawn == [(L.PHASE_DESERIALIZE, 4 * MS, 1 * MS),
                            (L.PHASE_EXECUTE, 5 * MS, 4 * MS),
                            (L.PHASE_STORE_OUTPUTS, 9 * MS, 1 * MS)]
    states_drawn = [(s.name, s.ts - T0, s.dur) for s in states_of(model, "a")[1]]
    assert states_drawn == [(L.STATE_PENDING_ARGS, 1 * MS, 2 * MS),
                            (L.STATE_SUBMITTED, 3 * MS, 1 * MS),
                            (L.STATE_RUNNING, 4 * MS, 8 * MS)]
    assert_engines_agree(path)


def test_a_task_at_its_worker_before_its_dispatch_was_reported_keeps_submitted(
    tmp_path: Path,
) -> None:
    """Ray Data reports a submission once Ray's submit returned: a warm actor may be
    running the task by then. Its SUBMITTED_TO_WORKER, clamped to the dispatch, is drawn
    0 long there (not dropped as other states that would last nothing are): the latency
    split then has its boundary (queue and push 0) instead of no split at all."""
    from tracer.ray.timeline import RayTaskEvents

    path = tmp_path / "early.perfetto-trace"
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="early", loop_pid=77, loop_tid=77)
        tl.expect_ray_events()
        a = tl.task_created(TimelineTask, "a", 0, ResourceRequest(num_cpus=1), T0,
                            stage_name="map")
        tl.task_dispatched(a, T0 + 5 * MS)  # reported after the task started on its worker
        tl.execution({"start_ns": T0 + 6 * MS, "end_ns": T0 + 9 * MS, "node_id": "n" * 40,
                      "pid": 500, "ray_task_id": "aa"}, a)
        tl.task_ended(a, T0 + 12 * MS, None)
        states = ((L.STATE_PENDING_ARGS, T0 + 1 * MS), (L.STATE_SUBMITTED, T0 + 2 * MS),
                  (L.STATE_RUNNING, T0 + 3 * MS), (L.STATE_FINISHED, T0 + 10 * MS))
        phases = ((L.PHASE_DESERIALIZE, T0 + 3 * MS, T0 + 4 * MS),
                  (L.PHASE_EXECUTE, T0 + 4 * MS, T0 + 9 * MS),
                  (L.PHASE_STORE_OUTPUTS, T0 + 9 * MS, T0 + 10 * MS))
        ev = RayTaskEvents("aa", 0, "map_fn", "n" * 40, 500, states,
                           (T0 + 3 * MS, T0 + 10 * MS), phases)
        assert tl.ray_events([ev]) == 1
        tl.close()

    model = read_trace(path, strict=True)
    states_drawn = [(s.name, s.ts - T0, s.dur) for s in states_of(model, "a")[1]]
    assert states_drawn == [(L.STATE_SUBMITTED, 5 * MS, 0), (L.STATE_RUNNING, 5 * MS, 5 * MS),
                            (L.STATE_FINISHED, 10 * MS, 2 * MS)]
    with TraceQuery(path, QueryConfig(engine="reader")) as q:
        (row,) = q.task_latency().to_dict("records")
    assert (row["sched_queue_ns"], row["sched_push_ns"]) == (0, 0)
    assert row["sched_queue_ns"] + row["sched_push_ns"] + row["sched_args_ns"] + (
        row["sched_start_ns"]) == row["scheduling_ns"] == 1 * MS
    assert_engines_agree(path)  # trace_processor nests the 0-long state as the reader does


def test_without_a_ray_events_producer_nothing_is_expected(tmp_path: Path) -> None:
    path = tmp_path / "no-ray-events.perfetto-trace"
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="plain", loop_pid=77, loop_tid=77)
        task = tl.task_created(TimelineTask, "a", 0, ResourceRequest(num_cpus=1), T0)
        tl.task_dispatched(task, T0 + MS)
        tl.execution({"start_ns": T0 + 2 * MS, "end_ns": T0 + 3 * MS, "node_id": "n",
                      "pid": 5, "ray_task_id": "aa"}, task)
        tl.task_ended(task, T0 + 4 * MS, None)
        assert tl.ray_events_wanted() == []
        tl.close()
    model = read_trace(path)
    run = next(s for s in model.slices if s.name == L.SLICE_EXECUTION)
    assert L.ARG_RAY_EVENTS_MISSING not in run.args
    assert not [i for i in model.instants if i.name == L.INSTANT_RAY_EVENTS]


def test_an_execution_drawn_late_goes_in_its_gap_on_the_worker(tmp_path: Path) -> None:
    """Executions are drawn as their tasks are received, not always in the order they ran.

    One drawn after a later one of the same worker stays on the worker's track when it
    fits in its gap; a lane under the worker (what a threaded actor's overlapping
    executions get) would show the worker running two tasks at once. It must end
    strictly before the next one begins: that one's begin is earlier in the file, and
    trace_processor orders events of one timestamp by file position.
    """
    path = tmp_path / "late.perfetto-trace"
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="late", runner_name="engine", loop_pid=5, loop_tid=5)

        drawn: dict[str, int] = {}

        def ran(name: str, start_ms: int, end_ms: int) -> None:
            drawn[name] = (end_ms - start_ms) * MS
            task = tl.task_created(TimelineTask, name, 0, ResourceRequest(), T0,
                                   stage_name="map")
            tl.execution({"start_ns": T0 + start_ms * MS, "end_ns": T0 + end_ms * MS,
                          "node_id": "n" * 40, "pid": 9}, task)
            tl.task_ended(task, T0 + 1000 * MS, None)

        with tl.late_batch():  # as the runner tracer draws a batch of received tasks
            ran("a", 10, 20)
            ran("c", 50, 60)
            ran("b", 30, 40)  # ran between a and c: their gap
        ran("d", 41, 49)  # a later batch, between b and c
        ran("overlap", 55, 70)  # runs beside c (a threaded actor): a lane
        ran("touching", 20, 30)  # would end where b begins, b's begin already written
        for i in range(70):  # in order, after everything
            ran(f"next{i}", 100 + 10 * i, 105 + 10 * i)
        # Drawn after 70 later ones (executions from Ray's events come a read late): still
        # in its gap, between a and b.
        ran("much later", 22, 25)
        # The producer says no execution to come starts before 400 ms: those that ended
        # by then are let go (next29, 390-395 ms, the last of them).
        tl.settle(T0 + 400 * MS)
        ran("forgotten", 0, 5)  # among those let go: not known to be free, a lane
        ran("after", 396, 399)  # after them, before next30 (400 ms): its gap
        tl.close()

    model = read_trace(path, strict=True)
    (node,) = [t for t in model.tracks.values() if t.name == "Node 0 (nnnnnnnn)"]
    (worker,) = [t for t in model.children(node.uuid) if t.name == "worker 9"]
    lanes = {t.uuid for t in model.children(worker.uuid) if t.name == "worker 9"}
    where: dict[str, str] = {}
    for s in model.slices:
        if s.category == L.CAT_EXECUTION:
            where[s.args[L.ARG_TASK_ID]] = (
                "worker" if s.track_uuid == worker.uuid else
                "lane" if s.track_uuid in lanes else "elsewhere"
            )
    on_lanes = {name for name, w in where.items() if w == "lane"}
    assert on_lanes == {"overlap", "touching", "forgotten"}, where
    assert {name for name, w in where.items() if w == "worker"} == (
        {"a", "b", "c", "d", "much later", "after"} | {f"next{i}" for i in range(70)})
    # Nothing misnested: each lasts what was drawn (had "touching" gone on the worker's
    # track, it would have read 20 ms and b 0 ms, nested in it, in trace_processor as in
    # our reader; tests/tp_check.py checks that they agree), and none overlap there.
    assert {s.args[L.ARG_TASK_ID]: s.dur for s in model.slices
            if s.category == L.CAT_EXECUTION} == drawn
    mine = sorted((s.ts, s.ts + s.dur) for s in model.slices if s.track_uuid == worker.uuid)
    assert all(end < nxt for (_, end), (nxt, _) in pairwise(mine))


def test_an_execution_that_ends_before_it_starts_lasts_nothing(tmp_path: Path) -> None:
    """A wall clock stepped back during a task (its measured end before its start): the
    execution is drawn 0 long where it started, and the worker's next one is unaffected."""
    path = tmp_path / "backwards.perfetto-trace"
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="back", runner_name="engine", loop_pid=5, loop_tid=5)
        for name, start_ms, end_ms in (("stepped", 10, 4), ("next", 12, 20)):
            task = tl.task_created(TimelineTask, name, 0, ResourceRequest(), T0,
                                   stage_name="map")
            tl.execution({"start_ns": T0 + start_ms * MS, "end_ns": T0 + end_ms * MS,
                          "node_id": "n" * 40, "pid": 9}, task)
            tl.task_ended(task, T0 + 30 * MS, None)
        tl.close()
    model = read_trace(path, strict=True)
    executions = {s.args[L.ARG_TASK_ID]: s for s in model.slices
                  if s.category == L.CAT_EXECUTION}
    assert (executions["stepped"].ts, executions["stepped"].dur) == (T0 + 10 * MS, 0)
    assert (executions["next"].ts, executions["next"].dur) == (T0 + 12 * MS, 8 * MS)
    assert executions["stepped"].track_uuid == executions["next"].track_uuid  # no lane


def test_an_execution_started_before_its_launch_was_recorded_keeps_its_arrow(
    tmp_path: Path,
) -> None:
    """Ray Data records a task's launch once Ray's submit has returned, and a warm worker
    can start the task first (a node's clock behind the driver's does the same).
    trace_processor draws no arrow that ends before it starts (flow_end_without_start):
    the execution is drawn from the launch, and says how much earlier it started.
    (tp_check checks, in trace_processor, that every task got its arrow.)"""
    path = tmp_path / "early.perfetto-trace"
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="early", runner_name="engine", loop_pid=5, loop_tid=5)
        for name, launch_ms, start_ms, end_ms in (
            ("early", 5, 3, 8), ("over before", 20, 17, 18), ("on time", 30, 31, 33),
        ):
            task = tl.task_created(TimelineTask, name, 0, ResourceRequest(), T0 + launch_ms * MS,
                                   stage_name="map")
            tl.task_dispatched(task, T0 + launch_ms * MS)
            tl.execution({"start_ns": T0 + start_ms * MS, "end_ns": T0 + end_ms * MS,
                          "node_id": "n" * 40, "pid": 9}, task)
            tl.task_ended(task, T0 + (max(launch_ms, end_ms) + 1) * MS, None)
        tl.stage_done(0)
        tl.close()
    model = read_trace(path, strict=True)
    assert not model.problems, model.problems
    executions = {s.args[L.ARG_TASK_ID]: s for s in model.slices
                  if s.category == L.CAT_EXECUTION}
    early, over, on_time = executions["early"], executions["over before"], executions["on time"]
    assert (early.ts, early.dur) == (T0 + 5 * MS, 3 * MS)
    assert early.args[L.ARG_STARTED_BEFORE_LAUNCH] == 2 * MS
    assert (over.ts, over.dur) == (T0 + 20 * MS, 0)
    assert over.args[L.ARG_STARTED_BEFORE_LAUNCH] == 3 * MS
    assert (on_time.ts, on_time.dur) == (T0 + 31 * MS, 2 * MS)
    assert L.ARG_STARTED_BEFORE_LAUNCH not in on_time.args
    assert len(model.flows) == 3


def test_a_worker_keeps_a_bounded_history_of_executions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a producer's watermark, a worker keeps its last executions only (here 4):
    one drawn late before those goes on a lane, one between them still in its gap."""
    from tracer.ray.timeline import nodes

    monkeypatch.setattr(nodes, "_RECENT", 4)
    path = tmp_path / "bounded.perfetto-trace"
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="bounded", runner_name="engine", loop_pid=5,
                         loop_tid=5)
        for name, start_ms in (("e0", 10), ("e1", 20), ("e2", 30), ("e3", 40), ("e4", 50),
                               ("e5", 60), ("early", 1), ("between", 56)):
            task = tl.task_created(TimelineTask, name, 0, ResourceRequest(), T0,
                                   stage_name="map")
            tl.execution({"start_ns": T0 + start_ms * MS, "end_ns": T0 + (start_ms + 3) * MS,
                          "node_id": "n" * 40, "pid": 9}, task)
            tl.task_ended(task, T0 + 100 * MS, None)
        tl.close()
    model = read_trace(path, strict=True)
    (worker,) = [t for t in model.tracks.values()
                 if t.name == "worker 9" and (model.parent_of(t.uuid) or t).name != "worker 9"]
    on_worker = {s.args[L.ARG_TASK_ID] for s in model.slices
                 if s.category == L.CAT_EXECUTION and s.track_uuid == worker.uuid}
    assert on_worker == {"e0", "e1", "e2", "e3", "e4", "e5", "between"}


def test_a_driver_clock_stepped_back_mid_wave_leaves_the_loop_nested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's wall clock steps back 50 ms inside a wave (NTP, a VM resumed): the
    loop's slices and the task's, timed by the writer's clock, stay nested, and the
    next wave is not drawn inside this one."""
    from tracer.ray import RunnerTracer

    monkeypatch.setenv("TRACER_RAY_EVENTS", "0")
    now = [T0]
    path = tmp_path / "stepped.perfetto-trace"
    writer = TraceWriter(path, clock=lambda: now[0], compress=True, time_unit_ns=1000)
    tracer = RunnerTracer(writer, execution_id="step", level=TracingLevel.TIMELINE,
                          cluster_resources={"CPU": 2.0})
    request = ResourceRequest(num_cpus=1)
    for wave in range(2):
        task_id = f"0-{wave}"
        now[0] += 10 * MS if wave == 0 else 60 * MS  # the clock has caught up by wave 1
        with tracer.dispatch_wave(wave):
            with tracer.dispatch_batching():
                tracer.task_created(task_id, 0, request, "map")
            now[0] += 1 * MS
            with tracer.dispatching():
                tracer.task_dispatched(task_id)
            if wave == 0:
                now[0] -= 50 * MS  # stepped back
            with tracer.awaiting(1, 0.1):
                now[0] += 1 * MS
            tracer.tasks_received_as_ready([task_id])
    tracer.stage_done(0)
    tracer.close()

    model = read_trace(path, strict=True)  # an END before its BEGIN would raise
    waves = [s for s in model.slices if s.name == L.SLICE_WAVE]
    assert [w.depth for w in waves] == [1, 1]  # in the execution's slice, side by side
    assert waves[0].end_ts <= waves[1].ts
    awaiting = [s for s in model.slices if s.name == L.SLICE_AWAITING]
    assert [(a.depth, a.dur) for a in awaiting] == [(2, 0), (2, MS)]
    tasks = [s for s in model.slices if s.category == L.CAT_TASK and s.depth == 0]
    assert len(tasks) == 2 and all(t.dur is not None and t.dur >= 0 for t in tasks)
    assert_engines_agree(path)


def test_the_memory_ray_reserved_is_the_request_where_the_runner_said_otherwise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """A runner that gives Ray another ``memory=`` than its ``ResourceRequest``: each
    execution is judged by what Ray reserved (what it scheduled by), the runner's figure
    is kept, the stage's summary follows, and the run says how many (a fresh user's
    runner: 100 MiB said and 16 reserved, 0 said and 16 reserved, 16 said and none)."""
    path = tmp_path / "requests.perfetto-trace"
    cases = {  # task: (the runner's request, what Ray reserved, the peak)
        "a": (100 * MIB, 16 * MIB, 60 * MIB),
        "b": (0, 16 * MIB, 60 * MIB),
        "c": (16 * MIB, 0, 60 * MIB),
        "d": (64 * MIB, 64 * MIB, 60 * MIB),
    }
    with caplog.at_level("WARNING", logger="tracer"), TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="req", runner_name="engine", level=TracingLevel.TIMELINE,
                         cluster_resources={"CPU": 4.0, "memory": 1024.0 * MIB},
                         loop_pid=77, loop_tid=77)
        for i, (task_id, (said, reserved, peak)) in enumerate(cases.items()):
            task = tl.task_created(TimelineTask, task_id, 0,
                                   ResourceRequest(num_cpus=1, memory_bytes=said),
                                   T0 + i * MS, stage_name="s")
            tl.task_dispatched(task, T0 + i * MS + 1)
            resources = {"CPU": 1.0, **({"memory": float(reserved)} if reserved else {})}
            tl.execution({"start_ns": T0 + 5 * MS, "end_ns": T0 + 9 * MS, "node_id": "n",
                          "pid": 500 + i, "rss_peak": peak, "assigned_resources": resources},
                         task)
            tl.task_ended(task, T0 + 10 * MS, None)
            tl.sample_resources()
        tl.stage_done(0)
        tl.close()
    warnings = [r.getMessage() for r in caplog.records if "Ray reserved" in r.getMessage()]
    assert len(warnings) == 1 and "'a'" in warnings[0]  # once a run, naming the first

    model = read_trace(path, strict=True)
    executions = {e.args[L.ARG_TASK_ID]: e.args for e in model.slices
                  if e.category == L.CAT_EXECUTION}
    assert {t: (a.get(L.ARG_MEMORY_REQUESTED), a.get(L.ARG_MEMORY_REQUESTED_BY_RUNNER),
                a.get(L.ARG_OVER_REQUEST)) for t, a in executions.items()} == {
        "a": (16 * MIB, 100 * MIB, True),
        "b": (16 * MIB, 0, True),
        "c": (0, 16 * MIB, None),  # Ray reserved nothing: no request to be over
        "d": (64 * MIB, None, None),
    }
    (stage,) = [s for s in model.slices if s.category == L.CAT_STAGE]
    assert stage.args[L.ARG_MEMORY_REQUESTED] == {"min": 0, "p50": 16 * MIB, "max": 64 * MIB}
    # A task holds Ray's figure from then on: what it gives back is what it holds.
    (available,) = [t for t in model.tracks.values() if t.name == L.COUNTER_AVAILABLE_MEMORY]
    assert [c.value for c in model.counters_on(available.uuid)][-1] == 1024 * MIB
    assert stage.args[L.ARG_TASKS_OVER_REQUEST] == 2
    with TraceQuery(path, QueryConfig(engine="reader")) as q:
        assert q.run_info()[L.ARG_MEMORY_REQUEST_MISMATCHES] == 3
        flagged = q.memory_flagged()
    assert sorted(flagged["task_id"]) == ["a", "b"]
    assert_engines_agree(path)
    assert main(["summary", str(path), "--engine", "reader"]) == 0
    assert "3 executions' memory requests are what Ray reserved" in capsys.readouterr().out


def test_executions_memray_measured_the_slower_way_are_counted_on_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Level 2 with a memray tracker per task (no C reader built, a memray the reader does
    not know) warned once in the worker only; the trace and the summary said nothing (a
    fresh user's review). Each such execution says so, the run counts them with why."""
    from tracer.ray import memory

    assert memory.MEMRAY_PER_TASK == L.MEMRAY_PER_TASK
    path = tmp_path / "per-task.perfetto-trace"
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="pt", runner_name="engine", level=TracingLevel.MEMORY,
                         loop_pid=77, loop_tid=77)
        for i in range(3):
            task = tl.task_created(TimelineTask, f"t{i}", 0, ResourceRequest(num_cpus=1),
                                   T0 + i * MS, stage_name="s")
            tl.task_dispatched(task, T0 + i * MS + 1)
            m = _measured(T0 + 5 * MS, "n", 500, 2 * MIB)
            if i:
                m.update(memray=L.MEMRAY_PER_TASK, memray_reason="the C reader is not built")
            tl.execution(m, task)
            tl.task_ended(task, T0 + 20 * MS, None)
        tl.stage_done(0)
        tl.close()
    model = read_trace(path, strict=True)
    said = sorted(e.args.get(L.ARG_MEMRAY, "-") for e in model.slices
                  if e.category == L.CAT_EXECUTION)
    assert said == ["-", L.MEMRAY_PER_TASK, L.MEMRAY_PER_TASK]
    for engine in ("reader", "trace_processor"):
        with TraceQuery(path, QueryConfig(engine=engine)) as q:  # type: ignore[arg-type]
            info = q.run_info()
        assert info[L.ARG_MEMRAY_PER_TASK] == 2, info
        assert info[L.ARG_MEMRAY_PER_TASK_REASON] == "the C reader is not built"
    assert main(["summary", str(path), "--engine", "reader"]) == 0
    assert ("2 executions were measured with a memray tracker each, ~20-90 ms more a task "
            "than one per worker: the C reader is not built") in capsys.readouterr().out

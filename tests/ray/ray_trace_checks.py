"""Checks of a runner trace shared by the Ray-layer tests.

A trace is read with :func:`tracer.format.reader.read_trace` and checked
against the names contract in :mod:`tracer.ray.layout`.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import Counter
from pathlib import Path
from typing import Any

from tracer.format.model import Instant, Slice, TraceModel, TrackInfo
from tracer.format.reader import read_trace
from tracer.ray import layout as L
from tracer.ray import wait_for_traces

CATEGORIES = {L.CAT_SCHEDULER, L.CAT_TASK, L.CAT_STAGE, L.CAT_EXECUTION, L.CAT_ATTEMPT}
LOOP_CHILDREN = {
    L.SLICE_PLAN_POLLING,
    L.SLICE_BATCHING,
    L.SLICE_DISPATCHING,
    L.SLICE_AWAITING,
    L.SLICE_NOOP_TASK,
}


def load(path: str | Path) -> TraceModel:
    """Read a trace that must have no problem at all (nothing trace_processor would drop),
    once the run that wrote it has finished it (Ray's last events come late)."""
    wait_for_traces(path)
    model = read_trace(path)
    assert not model.problems, [str(p) for p in model.problems]
    assert not model.truncated
    return model


@dataclasses.dataclass
class RunnerTrace:
    """A runner trace split along the layout: scheduler, task lanes, stages, nodes."""

    model: TraceModel
    root: TrackInfo
    scheduler: TrackInfo
    loop: TrackInfo
    counters: dict[str, TrackInfo]
    tasks_root: TrackInfo
    lanes: list[TrackInfo]
    stages_root: TrackInfo
    stage_tracks: list[TrackInfo]
    nodes: list[TrackInfo]
    workers: dict[int, list[TrackInfo]]  # node uuid -> its worker tracks

    def on(self, track: TrackInfo) -> list[Slice]:
        return self.model.slices_on(track.uuid)

    @property
    def loop_slices(self) -> list[Slice]:
        return self.on(self.loop)

    @property
    def task_slices(self) -> list[Slice]:
        """The outer slice of every task (created to received), on any lane."""
        return [s for lane in self.lanes for s in self.on(lane) if s.depth == 0]

    @property
    def dispatched_slices(self) -> list[Slice]:
        return [s for lane in self.lanes for s in self.on(lane) if s.depth == 1]

    @property
    def stage_slices(self) -> list[Slice]:
        return [s for t in self.stage_tracks for s in self.on(t)]

    def launches(self, track: TrackInfo) -> list[Instant]:
        """The 'task launched' marks on a stage's track."""
        return [i for i in self.model.instants
                if i.track_uuid == track.uuid and i.name == L.INSTANT_TASK_LAUNCHED]

    @property
    def executions(self) -> list[Slice]:
        """Every execution slice, on worker tracks (and their overlap lanes)."""
        return [s for s in self.model.slices if s.category == L.CAT_EXECUTION]

    def counter_values(self, name: str) -> list[int | float]:
        return [c.value for c in self.model.counters_on(self.counters[name].uuid)]

    def node_of(self, execution: Slice) -> TrackInfo:
        """The node an execution ran on: its worker's parent track."""
        track: TrackInfo | None = self.model.tracks[execution.track_uuid]
        while track is not None and not (track.name or "").startswith(L.NODE_PROCESS_PREFIX):
            track = self.model.parent_of(track.uuid)
        assert track is not None and track.name is not None
        assert track.name.startswith(L.NODE_PROCESS_PREFIX + " "), track
        return track


def split(model: TraceModel) -> RunnerTrace:
    """Find the layout's tracks, asserting its shape on the way: one root per run holding,
    in this order, the scheduler, the task lanes, the stages and the nodes (plain tracks)."""
    (root,) = model.children(None)
    assert root.kind == "track" and (root.name or "").startswith(L.RUN_TRACK_PREFIX + " ")
    assert root.child_ordering == "explicit"
    top = sorted(model.children(root.uuid), key=lambda t: t.sibling_order_rank or 0)
    scheduler, tasks_root, stages_root, *nodes = top
    assert (scheduler.name or "").startswith(L.SCHEDULER_PROCESS + " ("), scheduler
    assert scheduler.kind == "track" and scheduler.child_ordering == "explicit"
    under = model.children(scheduler.uuid)
    loops = [t for t in under if t.kind == "track"]
    assert [t.name for t in loops] == [L.DISPATCH_LOOP_THREAD]
    assert loops[0].sibling_order_rank == 0
    counters = {t.name or "": t for t in under if t.kind == "counter"}
    assert {L.COUNTER_INFLIGHT, L.COUNTER_AVAILABLE_CPUS} <= set(counters), counters
    # Every one ranked (the UI shows an explicitly ordered track's unranked children first,
    # in the order they were declared), top down: the loop, the run's tasks in flight,
    # each stage's in stage order, the object store the run holds, what the cluster has left.
    assert all(t.sibling_order_rank is not None for t in under), under
    order = [t.name or "" for t in sorted(under, key=lambda t: t.sibling_order_rank or 0)]
    tail = [n for n in (L.COUNTER_OBJECT_STORE_USED, L.COUNTER_AVAILABLE_CPUS,
                        L.COUNTER_AVAILABLE_GPUS, L.COUNTER_AVAILABLE_MEMORY,
                        L.COUNTER_AVAILABLE_OBJECT_STORE) if n in counters]
    assert order[:2] == [L.DISPATCH_LOOP_THREAD, L.COUNTER_INFLIGHT], order
    assert order[len(order) - len(tail):] == tail, order
    per_stage = order[2:len(order) - len(tail)]
    # Stage by stage: its tasks in flight, then (Ray Data) its queued blocks and backpressure.
    kinds = (L.COUNTER_STAGE_INFLIGHT, L.COUNTER_STAGE_QUEUED, L.COUNTER_STAGE_BACKPRESSURED)
    stage_of = [re.compile(re.escape(k).replace(r"\{stage\}", r"(\d+): .*")) for k in kinds]
    keys = [next(((int(m.group(1)), i) for i, p in enumerate(stage_of)
                  if (m := p.fullmatch(name))), None) for name in per_stage]
    assert None not in keys and keys == sorted(keys), order  # type: ignore[type-var]

    assert (tasks_root.kind, tasks_root.name) == ("track", L.TASKS_TRACK)
    # The tasks' lanes, then (where Ray's events were read) the lanes of their Ray states:
    # two names, two tracks in the UI (each merged), in that order.
    under_tasks = model.children(tasks_root.uuid)
    lanes = [t for t in under_tasks if t.name == L.TASK_LANE]
    assert lanes, "no task lanes"
    assert {t.name for t in under_tasks} <= {L.TASK_LANE, L.RAY_STATES_TRACK}
    assert tasks_root.child_ordering == "explicit"
    assert all(t.sibling_order_rank == (t.name != L.TASK_LANE) for t in under_tasks)
    assert (stages_root.kind, stages_root.name) == ("track", L.STAGES_TRACK)
    assert stages_root.child_ordering == "explicit"
    # In the UI's order (their ranks: the stages' ids), not the order they were declared in
    # (an actor pool's stage is declared as its actors start, before its first task).
    stage_tracks = sorted(model.children(stages_root.uuid),
                          key=lambda t: t.sibling_order_rank or 0)

    assert all((t.name or "").startswith(L.NODE_PROCESS_PREFIX + " ") for t in nodes), nodes
    assert all(t.kind == "track" and t.child_ordering == "explicit" for t in nodes), nodes
    workers = {n.uuid: [t for t in model.children(n.uuid) if t.kind == "track"] for n in nodes}
    for tracks in workers.values():
        assert all((t.name or "").startswith(L.WORKER_THREAD_PREFIX + " ") for t in tracks)
    assert not [t for t in model.tracks.values() if t.kind in ("process", "thread")]
    return RunnerTrace(
        model, root, scheduler, loops[0], counters, tasks_root, lanes, stages_root,
        stage_tracks, nodes, workers,
    )


def check_driver_gc_totals(args: dict[str, Any]) -> None:
    """The run's slice ends with the driver's GC while it was traced (tracer.ray.driver_gc)."""
    count = args[L.ARG_DRIVER_GC_COLLECTIONS]
    total = args[L.ARG_DRIVER_GC_NS]
    longest = args[L.ARG_DRIVER_GC_LONGEST_NS]
    assert all(isinstance(v, int) and v >= 0 for v in (count, total, longest)), args
    assert longest <= total and (count == 0) == (total == 0), args


def check_well_formed(model: TraceModel) -> None:
    """Every slice closed, one known category each, children inside their parents."""
    by_id = {s.id: s for s in model.slices}
    for s in model.slices:
        assert s.dur is not None and s.dur >= 0, s
        assert s.category in CATEGORIES, s
        if s.parent_id is not None:
            parent = by_id[s.parent_id]
            assert parent.ts <= s.ts and s.ts + s.dur <= parent.ts + (parent.dur or 0), (parent, s)
    for i in model.instants:
        assert i.category in CATEGORIES, i


def check_runner_trace(
    path: str | Path, stages: dict[str, int], *, return_channel: bool = True
) -> RunnerTrace:
    """All the checks that hold for any complete, successful traced execution.

    ``stages`` maps each stage name (in stage-id order) to its number of tasks.
    """
    model = load(path)
    check_well_formed(model)
    rt = split(model)
    total = sum(stages.values())

    # Stages: one track per stage, explicitly ordered, one slice each.
    assert [t.name for t in rt.stage_tracks] == [f"{i}: {n}" for i, n in enumerate(stages)]
    assert [t.sibling_order_rank for t in rt.stage_tracks] == list(range(len(stages)))
    assert all(t.sibling_merge_behavior == "none" for t in rt.stage_tracks)
    for i, (name, num_tasks) in enumerate(stages.items()):
        (stage,) = rt.on(rt.stage_tracks[i])
        assert (stage.name, stage.category) == (name, L.CAT_STAGE)
        assert stage.args[L.ARG_STAGE_ID] == i
        assert stage.args["num_tasks"] == num_tasks
        assert not stage.flow_ids_out
        launches = rt.launches(rt.stage_tracks[i])
        assert len(launches) == num_tasks
        assert all(m.parent_id == stage.id and len(m.flow_ids_out) == 1 for m in launches)

    # Dispatch loop: one execution slice holding the waves, which hold the phases.
    loop = rt.loop_slices
    roots = [s for s in loop if s.depth == 0]
    assert [s.name for s in roots] == [L.SLICE_EXECUTION]
    check_driver_gc_totals(roots[0].args)
    by_id = {s.id: s for s in loop}
    waves = [s for s in loop if s.depth == 1]
    assert waves and {s.name for s in waves} == {L.SLICE_WAVE}
    assert [s.args["wave"] for s in waves] == list(range(len(waves)))
    for s in loop:
        assert s.category == L.CAT_SCHEDULER
        if s.depth >= 2:
            assert s.name in LOOP_CHILDREN, s
        if s.name == L.SLICE_PLAN_POLLING:
            assert by_id[s.parent_id].name == L.SLICE_BATCHING, s  # type: ignore[index]
        elif s.depth == 2:
            assert by_id[s.parent_id].name == L.SLICE_WAVE, s  # type: ignore[index]
    phases = Counter(s.name for s in loop)
    for phase in (L.SLICE_BATCHING, L.SLICE_PLAN_POLLING, L.SLICE_DISPATCHING, L.SLICE_AWAITING):
        assert phases[phase] >= 1, phases
    assert phases[L.SLICE_DISPATCHING] <= len(waves)
    for s in loop:
        if s.name == L.SLICE_AWAITING:
            assert s.args["num_returns"] >= 1 and s.args["timeout_s"] > 0, s
            assert "num_ready" in s.args, s

    # Task lanes: an outer slice per task holding exactly one "dispatched"; no overlap.
    tasks = rt.task_slices
    assert len(tasks) == total
    assert len({s.args[L.ARG_TASK_ID] for s in tasks}) == total
    assert Counter(s.name for s in tasks) == Counter(stages)
    for lane in rt.lanes:
        slices = rt.on(lane)
        assert all(s.depth <= 1 for s in slices), slices
        outer = sorted((s for s in slices if s.depth == 0), key=lambda s: s.ts)
        for a, b in itertools.pairwise(outer):
            assert a.ts + (a.dur or 0) <= b.ts, (a, b)
        for s in outer:
            assert s.category == L.CAT_TASK
            inner = [c for c in slices if c.parent_id == s.id]
            assert [(c.name, c.category) for c in inner] == [(L.SLICE_DISPATCHED, L.CAT_TASK)], s
    stage_ids = {name: i for i, name in enumerate(stages)}
    for s in tasks:
        assert s.args[L.ARG_STAGE] == s.name
        assert s.args[L.ARG_STAGE_ID] == stage_ids[s.name]
        request = s.args[L.ARG_RESOURCE_REQUEST]
        assert set(request) == {"num_cpus", "num_gpus", "memory_bytes"}, request

    # Flows: from each stage's slice to every execution of that stage's tasks.
    check_executions(rt, stages)
    return rt


def check_executions(rt: RunnerTrace, stages: dict[str, int]) -> None:
    """One execution per task, inside its dispatched slice, with a flow from its stage."""
    model = rt.model
    executions = rt.executions
    assert len(executions) == sum(stages.values())
    dispatched = {
        model.slice_by_id(d.parent_id).args[L.ARG_TASK_ID]: d  # type: ignore[arg-type]
        for d in rt.dispatched_slices
    }
    task_of = {s.args[L.ARG_TASK_ID]: s for s in rt.task_slices}
    flows_into: dict[int, list[int]] = {}
    for flow in model.flows:
        flows_into.setdefault(flow.dest_id, []).append(flow.source_id)
    stage_of_track = {t.uuid: s.name for t in rt.stage_tracks for s in rt.on(t)}
    launch = {m.id: m for t in rt.stage_tracks for m in rt.launches(t)}
    for e in executions:
        task_id = e.args[L.ARG_TASK_ID]
        task = task_of[task_id]
        assert e.name == task.name
        rt.node_of(e)
        d = dispatched[task_id]
        assert d.ts <= e.ts and e.ts + (e.dur or 0) <= d.ts + (d.dur or 0), (d, e)
        assert isinstance(e.args[L.ARG_RAY_TASK_ID], str) and len(e.args[L.ARG_RAY_TASK_ID]) > 16
        assigned = e.args[L.ARG_ASSIGNED_RESOURCES]
        request = task.args[L.ARG_RESOURCE_REQUEST]
        if request["num_cpus"]:
            assert assigned["CPU"] == request["num_cpus"], (assigned, request)
        # The arrow leaves the stage's track where the task was launched (created).
        (source,) = flows_into[e.id]
        assert stage_of_track[launch[source].track_uuid] == e.name, e
        assert launch[source].args[L.ARG_TASK_ID] == task_id
        assert launch[source].ts == task.ts
    # Every flow leaves a stage's launch mark and ends on an execution.
    by_id: dict[int, Slice | Instant] = {s.id: s for s in model.slices}
    by_id.update({i.id: i for i in model.instants})
    for flow in model.flows:
        assert by_id[flow.source_id].category == L.CAT_STAGE
        assert by_id[flow.dest_id].category == L.CAT_EXECUTION
    assert len(model.flows) == len(executions)


def args_of(slices: list[Slice], key: str) -> list[Any]:
    return [s.args.get(key) for s in slices]

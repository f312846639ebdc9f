"""Checks that hold for every Ray Data trace (shared by the Ray Data tests)."""

from __future__ import annotations

import itertools
from pathlib import Path

from ray_trace_checks import (
    RunnerTrace,
    check_driver_gc_totals,
    check_well_formed,
    load,
    split,
)

from tracer.format.model import Slice, TraceModel
from tracer.ray import layout as L


def only_trace(folder: Path) -> Path:
    (path,) = sorted(folder.glob("ray-data.*.perfetto-trace"))
    return path


def load_data_trace(path: Path) -> tuple[TraceModel, RunnerTrace]:
    model = load(path)
    check_well_formed(model)
    return model, split(model)


def executions(model: TraceModel) -> list[Slice]:
    return [
        s for s in model.slices
        if s.category == L.CAT_EXECUTION and s.name not in (
            L.INSTANT_TASK_FAILED, L.INSTANT_TASK_CANCELLED)
    ]


def by_task(slices: list[Slice]) -> dict[str, Slice]:
    out: dict[str, Slice] = {}
    for s in slices:
        task_id = s.args[L.ARG_TASK_ID]
        assert task_id not in out, s
        out[task_id] = s
    return out


def check_data_trace(rt: RunnerTrace, stages: dict[str, int]) -> dict[str, int]:
    """The layout of a complete execution whose every task was measured.

    ``stages``: stage track name ("1: MapBatches(f)") -> its number of tasks.
    """
    model = rt.model
    assert [t.name for t in rt.stage_tracks] == list(stages), [t.name for t in rt.stage_tracks]
    for track in rt.stage_tracks:
        (stage,) = rt.on(track)
        assert track.name == f"{stage.args[L.ARG_STAGE_ID]}: {stage.name}"
        assert stage.args["num_tasks"] == stages[track.name or ""]
        # An arrow per task, from the 'task launched' mark nested in the stage's slice.
        launches = rt.launches(track)
        assert len(launches) == stages[track.name or ""]
        assert all(m.parent_id == stage.id and len(m.flow_ids_out) == 1 for m in launches)
    (run,) = [s for s in rt.loop_slices if s.depth == 0]
    assert run.name == L.SLICE_EXECUTION and run.args["runner"] == "ray-data"
    assert run.args[L.ARG_LOST_MEASUREMENTS] == 0
    check_driver_gc_totals(run.args)
    waves = [s for s in rt.loop_slices if s.depth == 1]
    assert {s.name for s in waves} == {L.SLICE_WAVE}
    assert [s.args[L.ARG_WAVE] for s in waves] == list(range(len(waves)))
    for a, b in itertools.pairwise(waves):  # the steps follow each other
        assert a.ts + (a.dur or 0) <= b.ts

    tasks = rt.task_slices
    assert len(tasks) == sum(stages.values())
    task_of = by_task(tasks)
    execs = executions(model)
    assert len(execs) == len(tasks)
    flows_into = {f.dest_id: f.source_id for f in model.flows}
    stage_slice = {s.name: s for s in rt.stage_slices}
    launched = {m.id: m for t in rt.stage_tracks for m in rt.launches(t)}
    for e in execs:
        task = task_of[e.args[L.ARG_TASK_ID]]
        assert e.name == task.name
        (dispatched,) = [s for s in rt.dispatched_slices if s.parent_id == task.id]
        assert dispatched.ts <= e.ts and e.ts + (e.dur or 0) <= task.ts + (task.dur or 0)
        launch = launched[flows_into[e.id]]
        assert launch.parent_id == stage_slice[e.name].id
        assert launch.args[L.ARG_TASK_ID] == e.args[L.ARG_TASK_ID]
        rt.node_of(e)
    # A worker's executions follow each other (no overlap lanes in these pipelines): under
    # a worker, at most its lane of Ray's phases.
    for threads in rt.workers.values():
        for thread in threads:
            lanes = [c.name for c in model.children(thread.uuid) if c.kind == "track"]
            assert lanes in ([], [L.RAY_PHASES_TRACK]), (thread, lanes)
    return {name: n for name, n in stages.items()}

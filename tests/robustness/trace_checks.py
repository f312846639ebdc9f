"""What every trace of a run that went wrong must still be: complete and valid.

Shared by the robustness tests (this folder is on ``sys.path`` when they run).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tracer.format import read_trace
from tracer.format.model import Instant, Slice, TraceModel
from tracer.ray import layout as L
from tracer.ray import wait_for_traces


def load_complete(path: str | Path) -> TraceModel:
    """Read a trace that must have no problem, not be cut, and have every slice closed,
    each inside its parent (once the run that wrote it has finished it)."""
    wait_for_traces(path)
    model = read_trace(path)
    assert not model.problems, [str(p) for p in model.problems]
    assert not model.truncated
    by_id = {s.id: s for s in model.slices}
    for s in model.slices:
        assert s.dur is not None and s.dur >= 0, s
        if s.parent_id is not None:
            parent = by_id[s.parent_id]
            assert parent.dur is not None
            assert parent.ts <= s.ts and s.ts + s.dur <= parent.ts + parent.dur, (parent, s)
    # Every flow ends on an execution (it starts on its stage's track, at the task's launch).
    launches = {i.id: i for i in model.instants if i.name == L.INSTANT_TASK_LAUNCHED}
    for flow in model.flows:
        assert launches[flow.source_id].category == L.CAT_STAGE
        assert by_id[flow.dest_id].category == L.CAT_EXECUTION
    return model


def execution_slice(model: TraceModel) -> Slice:
    """The dispatch loop's outer slice (its END carries lost_measurements and the run's error)."""
    (root,) = [s for s in model.slices if s.name == L.SLICE_EXECUTION and s.depth == 0
               and s.category == L.CAT_SCHEDULER]
    return root


def tasks_by_id(model: TraceModel) -> dict[str, list[Slice]]:
    """The outer task slices (created to received) by task id, in time order."""
    out: dict[str, list[Slice]] = defaultdict(list)
    for s in sorted(model.slices, key=lambda s: s.ts):
        if s.category == L.CAT_TASK and s.depth == 0:
            out[s.args[L.ARG_TASK_ID]].append(s)
    return dict(out)


def executions_by_task(model: TraceModel) -> dict[str, list[Slice]]:
    """Execution slices (on worker tracks) by task id, in time order."""
    out: dict[str, list[Slice]] = defaultdict(list)
    for s in sorted(model.slices, key=lambda s: s.ts):
        if s.category == L.CAT_EXECUTION:
            out[s.args[L.ARG_TASK_ID]].append(s)
    return dict(out)


def instants_named(model: TraceModel, name: str) -> list[Instant]:
    return [i for i in model.instants if i.name == name]


def track_path(model: TraceModel, item: Slice | Instant) -> list[str | None]:
    return model.track_path(item.track_uuid)

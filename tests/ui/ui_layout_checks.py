"""What a runner trace must look like in the Perfetto UI: the layout of tracer.ray.layout,
read back from the UI's own track tree and compared with the trace itself."""

from __future__ import annotations

import re
from collections import Counter

from ui_shot import Node, UiRun, assert_loaded_cleanly

from tracer.format import TraceModel
from tracer.ray import layout as L

SLICES = "SliceTrack"
COUNTER = "TraceProcessorCounterTrack"
GROUP = "GroupSummaryTrack"
#: Linux pids (pid_max) are below this: a larger number in a name is a synthetic id.
PID_LIMIT = 1 << 22
NODE_NAME = re.compile(rf"{L.NODE_PROCESS_PREFIX} (\d+) \(([0-9a-f]{{8}}|unknown)\)")
WORKER_NAME = re.compile(rf"{L.WORKER_THREAD_PREFIX} (\d+)")
SCHEDULER_COUNTERS = [L.COUNTER_INFLIGHT, L.COUNTER_AVAILABLE_CPUS, L.COUNTER_AVAILABLE_GPUS,
                      L.COUNTER_AVAILABLE_MEMORY]
NODE_COUNTERS = [L.COUNTER_NODE_MEMORY_REQUESTED, L.COUNTER_NODE_MEMORY_USED]


def check_runner_layout(run: UiRun, model: TraceModel, stages: dict[str, int]) -> Node:
    """The whole tree of a one-run trace, top-down; returns the run's node.

    ``stages`` maps each stage's name (in stage-id order) to how many tasks it launched.
    """
    where = run.where()
    assert_loaded_cleanly(run)
    (loop_track,) = [t for t in model.tracks.values() if t.name == L.DISPATCH_LOOP_THREAD]
    (execution,) = [s for s in model.slices_on(loop_track.uuid) if s.depth == 0]
    execution_id = execution.args["execution_id"]

    # Top level: Perfetto's System group (the clock snapshot every trace needs for its
    # timestamps; collapsed, and nothing of ours in it), then the run.
    assert [r.name for r in run.roots] == ["System", f"{L.RUN_TRACK_PREFIX} {execution_id}"], (
        [r.name for r in run.roots], where)
    assert run.root("System").names == ["Clock Snapshots"], where
    root = run.roots[1]
    scheduler, tasks, stages_node, *nodes = root.children
    assert [scheduler.name, tasks.name, stages_node.name] == [
        f"{L.SCHEDULER_PROCESS} ({execution.args['runner']})", L.TASKS_TRACK, L.STAGES_TRACK,
    ], (root.names, where)
    assert nodes, where

    # The scheduler: the dispatch loop first (its slices), then its counters.
    loop, *counters = scheduler.children
    assert (loop.name, loop.renderer) == (L.DISPATCH_LOOP_THREAD, SLICES), where
    assert loop.slice_names[L.SLICE_EXECUTION] == 1 and loop.slice_names[L.SLICE_WAVE] >= 1
    # Under the loop, only the driver's long GC pauses, when it had any (of 1 ms or more).
    assert [c.name for c in loop.children] in ([], [L.DRIVER_GC_TRACK]), (loop.names, where)
    for pauses in loop.children:
        assert pauses.renderer == SLICES and not pauses.children, where
        assert all(n.startswith(L.SLICE_GC_PREFIX) for n in pauses.slice_names), where
    assert [c.name for c in counters] == [n for n in SCHEDULER_COUNTERS if n in scheduler.names]
    assert {L.COUNTER_INFLIGHT, L.COUNTER_AVAILABLE_CPUS} <= set(scheduler.names), where
    assert all(c.renderer == COUNTER and not c.children for c in counters), where

    # Tasks: one merged lane track with every task's outer slice and its 'dispatched'; then,
    # where Ray's events were read, one merged track of their states (however many tasks
    # were in flight): each task's in a 'ray states <stage>' slice.
    lanes, *ray_states = tasks.children
    assert (lanes.name, lanes.renderer) == (L.TASK_LANE, SLICES), where
    assert [c.name for c in ray_states] in ([], [L.RAY_STATES_TRACK]), (tasks.names, where)
    for track in ray_states:
        assert track.renderer == SLICES and not track.children, where
        heads = sum(n for name, n in track.slice_names.items()
                    if name.startswith(L.RAY_STATES_PREFIX))
        assert heads == sum(1 for s in model.slices
                            if (s.name or "").startswith(L.RAY_STATES_PREFIX)), where
        assert heads and track.slice_names.get(L.STATE_RUNNING), where
    launched = sum(stages.values())
    dispatched = sum(1 for s in model.slices if s.name == L.SLICE_DISPATCHED)
    assert dispatched and lanes.slice_names[L.SLICE_DISPATCHED] == dispatched, where
    assert dispatched <= launched, where
    assert {n: lanes.slice_names.get(n, 0) for n in stages} == stages, where

    # Stages in stage-id order, each a slice with a 'task launched' mark per task.
    assert stages_node.names == [f"{i}: {n}" for i, n in enumerate(stages)], where
    for track, (name, n) in zip(stages_node.children, stages.items(), strict=True):
        assert track.renderer == SLICES and track.slice_names == {
            name: 1, L.INSTANT_TASK_LAUNCHED: n}, (track, where)
        assert track.count("instants") == n, (track, where)

    # Nodes in the order seen; each its memory counters (shared scale), then its workers.
    executed = 0
    for index, node in enumerate(nodes):
        m = NODE_NAME.fullmatch(node.name)
        assert m and int(m.group(1)) == index, (node.name, where)
        counters = [c for c in node.children if c.renderer == COUNTER]
        assert counters == node.children[: len(counters)], (node.names, where)
        assert [c.name for c in counters] in ([], NODE_COUNTERS), (node.names, where)
        workers = node.children[len(counters):]
        assert workers, (node.name, where)
        for worker in workers:
            executed += check_worker(worker, where)
    # Every execution (and failure mark) the trace has on a worker, the UI shows there.
    on_workers = Counter(
        s.name for s in [*model.slices, *model.instants]
        if s.category == L.CAT_EXECUTION and _on_a_worker(model, s.track_uuid)
    )
    assert executed == sum(on_workers.values()), (executed, on_workers, where)

    # Arrows: one per executed task, each from its stage's launch mark.
    flows = int(run.flows[0].removeprefix("flows: "))
    assert flows == len(model.flows) and flows >= 1, where
    assert all(line.startswith(f"{L.INSTANT_TASK_LAUNCHED} (#") for line in run.flows[1:] if line)

    # No synthetic id anywhere: every number in a name is a real pid, an index or a stage id
    # (a node's hex id, all digits now and then, is not a number).
    for node in root.walk():
        name = node.name if node is not root else ""
        m = NODE_NAME.fullmatch(name)
        for number in re.findall(r"\d+", m.group(1) if m else name):
            assert int(number) < PID_LIMIT, (node.name, where)
    return root


def check_worker(worker: Node, where: str) -> int:
    """A worker: its executions on its own track; lanes, Ray's phases, RSS and heap under it.
    Returns how many slices (executions and failure marks) it shows."""
    m = WORKER_NAME.fullmatch(worker.name)
    assert m and 0 < int(m.group(1)) < PID_LIMIT, (worker.name, where)
    assert worker.renderer == SLICES, (worker, where)
    order = [worker.name, L.RAY_PHASES_TRACK, L.COUNTER_WORKER_RSS, L.COUNTER_WORKER_HEAP]
    ranks = [order.index(n) for n in worker.names]
    assert ranks == sorted(ranks), (worker.names, where)
    assert L.COUNTER_WORKER_RSS in worker.names, (worker.names, where)
    shown = worker.count("slices")
    for child in worker.children:
        if child.name == worker.name:  # a lane of overlapping executions
            shown += child.count("slices")
        elif child.name == L.RAY_PHASES_TRACK:
            assert child.renderer == SLICES and child.slice_names.get(L.PHASE_EXECUTE), where
        else:
            assert child.renderer == COUNTER and child.count("counter values") > 0, where
    assert shown >= 1, (worker, where)
    return shown


def _on_a_worker(model: TraceModel, uuid: int) -> bool:
    """On a worker's track or a lane under it (not on the node's own track)."""
    track = model.tracks.get(uuid)
    for _ in range(2):
        parent = model.parent_of(track.uuid) if track is not None else None
        if parent is not None and (parent.name or "").startswith(L.NODE_PROCESS_PREFIX + " "):
            return True
        track = parent
    return False

"""A traced run of the reference runner on a real (local) Ray: the trace's content."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from ray_trace_checks import RunnerTrace, check_runner_trace

from tracer.ray import layout as L
from tracer.runner import Pipeline, Stage

NUM_PARTITIONS = 8
MIB = 1 << 20


def _slow_inc(x: int) -> int:
    time.sleep(0.02)  # long enough that tasks overlap and are seen in flight
    return x + 1


def _double(x: int) -> int:
    return 2 * x


def _neg(x: int) -> int:
    time.sleep(0.01)
    return -x


STAGES = [
    Stage("inc", _slow_inc),
    Stage("double", _double, num_cpus=0.5, memory_bytes=16 * MIB),
    Stage("neg", _neg),
]


@pytest.fixture(scope="module")
def run(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("trace") / "run.perfetto-trace"
    pipeline = Pipeline(list(range(NUM_PARTITIONS)), STAGES)
    results = pipeline.run(tracing_level=1, trace_path=path, execution_id="ex1", progress=False)
    return {"results": results, "path": path, "pipeline": pipeline}


@pytest.fixture(scope="module")
def rt(run: dict[str, Any]) -> RunnerTrace:
    return check_runner_trace(run["path"], {s.name: NUM_PARTITIONS for s in STAGES})


def test_results_in_partition_order(run: dict[str, Any]) -> None:
    assert run["results"] == [-2 * (i + 1) for i in range(NUM_PARTITIONS)]
    assert run["pipeline"].trace_path == run["path"]


def test_track_layout(rt: RunnerTrace) -> None:
    model = rt.model
    assert rt.scheduler.name == f"{L.SCHEDULER_PROCESS} (pipeline)"
    assert set(rt.counters) == {
        L.COUNTER_INFLIGHT,
        L.COUNTER_AVAILABLE_CPUS,
        L.COUNTER_AVAILABLE_GPUS,
        L.COUNTER_AVAILABLE_MEMORY,
    }
    assert rt.counters[L.COUNTER_AVAILABLE_MEMORY].unit == "bytes"
    assert rt.counters[L.COUNTER_INFLIGHT].unit == "count"
    # Order under the run's root: scheduler, tasks, stages, then one track per node.
    execution_id = rt.loop_slices[0].args["execution_id"]
    assert rt.root.name == f"{L.RUN_TRACK_PREFIX} {execution_id}"
    assert rt.scheduler.sibling_order_rank == 0
    assert rt.tasks_root.sibling_order_rank == 1
    assert rt.stages_root.sibling_order_rank == 2
    assert [n.sibling_order_rank for n in rt.nodes] == list(range(3, 3 + len(rt.nodes)))
    assert len(rt.nodes) == 1  # a single-node cluster
    # A track per worker process that ran a task, named after its real pid.
    workers = rt.workers[rt.nodes[0].uuid]
    assert workers
    assert len({t.name for t in workers}) == len(workers)
    for t in workers:  # "worker <pid>": a real Linux pid (below pid_max), no synthetic id
        prefix, pid = (t.name or "").split(" ")
        assert prefix == L.WORKER_THREAD_PREFIX and 0 < int(pid) < (1 << 22), t
    del model
    # Lanes: no more than the tasks that were ever in flight at once.
    assert len(rt.lanes) <= max(rt.counter_values(L.COUNTER_INFLIGHT))


def test_categories_one_per_slice(rt: RunnerTrace) -> None:
    categories = {s.category for s in rt.model.slices}
    assert categories == {L.CAT_SCHEDULER, L.CAT_TASK, L.CAT_STAGE, L.CAT_EXECUTION}


def test_stage_slices_span_their_tasks(rt: RunnerTrace) -> None:
    for stage in rt.stage_slices:
        tasks = [s for s in rt.task_slices if s.name == stage.name]
        assert stage.ts == min(s.ts for s in tasks)
        assert stage.ts + (stage.dur or 0) == max(s.ts + (s.dur or 0) for s in tasks)
        assert set(stage.flow_ids_out) == {
            f.flow_id for f in rt.model.flows if f.source_id == stage.id
        }


def test_counters(rt: RunnerTrace) -> None:
    inflight = rt.counter_values(L.COUNTER_INFLIGHT)
    assert inflight[0] > 0 and inflight[-1] == 0
    assert 2 <= max(inflight) <= 4  # 2 CPUs; tasks of 1 CPU, or of 0.5 CPU
    cpus = rt.counter_values(L.COUNTER_AVAILABLE_CPUS)
    assert cpus[0] == 2 and cpus[-1] == 2
    assert all(0 <= v <= 2 for v in cpus)
    # Sampled at the end of every wave: below the total exactly when tasks were still running.
    busy_at_wave_end = any(
        s.args["inflight"] for s in rt.loop_slices if s.name == L.SLICE_WAVE
    )
    assert (min(cpus) < 2) == busy_at_wave_end
    memory = rt.counter_values(L.COUNTER_AVAILABLE_MEMORY)
    assert memory and memory[0] == memory[-1] > 0  # sampled at wave ends, back to the total
    assert all(v >= memory[0] - 4 * 16 * MIB for v in memory)


def test_task_annotations(rt: RunnerTrace) -> None:
    expected_request = {
        "inc": {"num_cpus": 1, "num_gpus": 0, "memory_bytes": 0},
        "double": {"num_cpus": 0.5, "num_gpus": 0, "memory_bytes": 16 * MIB},
        "neg": {"num_cpus": 1, "num_gpus": 0, "memory_bytes": 0},
    }
    ids = {f"{i}-{p}" for i in range(len(STAGES)) for p in range(NUM_PARTITIONS)}
    assert {s.args[L.ARG_TASK_ID] for s in rt.task_slices} == ids
    for s in rt.task_slices:
        assert s.args[L.ARG_RESOURCE_REQUEST] == expected_request[s.name]
        assert s.args[L.ARG_TASK_ID].startswith(f"{s.args[L.ARG_STAGE_ID]}-")


def test_execution_annotations(rt: RunnerTrace) -> None:
    ray_ids = [e.args[L.ARG_RAY_TASK_ID] for e in rt.executions]
    assert len(set(ray_ids)) == len(ray_ids)
    for e in rt.executions:
        if e.name == "double":
            assert e.args[L.ARG_ASSIGNED_RESOURCES] == {"CPU": 0.5, "memory": 16 * MIB}
        else:
            assert e.args[L.ARG_ASSIGNED_RESOURCES] == {"CPU": 1}
        assert e.args["memory_requested"] == (16 * MIB if e.name == "double" else 0)
        assert e.args["memory_peak"] > 0
        # Measured inside the worker: the sleep shows in the duration.
        if e.name == "inc":
            assert e.dur is not None and e.dur >= 20_000_000


def test_wave_annotations(rt: RunnerTrace) -> None:
    waves = [s for s in rt.loop_slices if s.name == L.SLICE_WAVE]
    assert sum(w.args["dispatched"] for w in waves) == len(STAGES) * NUM_PARTITIONS
    assert sum(w.args["received"] for w in waves) == len(STAGES) * NUM_PARTITIONS
    assert waves[-1].args["inflight"] == 0
    (execution,) = [s for s in rt.loop_slices if s.depth == 0]
    assert execution.args["execution_id"] == "ex1"
    assert execution.args["runner"] == "pipeline"
    assert execution.args["tracing_level"] == 1
    assert execution.args["lost_measurements"] == 0
    awaiting = [s for s in rt.loop_slices if s.name == L.SLICE_AWAITING]
    assert {(s.args["num_returns"], s.args["timeout_s"]) for s in awaiting} == {(1, 0.1)}
    instants = {i.name for i in rt.model.instants if i.track_uuid == rt.loop.uuid}
    assert L.INSTANT_MATERIALIZED in instants
    # Tasks added to a batch and dispatched are counted in their wave's args.
    waves = [s for s in rt.loop_slices if s.name == L.SLICE_WAVE]
    tasks = len([s for s in rt.model.slices if s.category == L.CAT_TASK and s.depth == 0])
    assert sum(w.args.get(L.ARG_TASKS_ADDED, 0) for w in waves) == tasks
    assert sum(w.args.get(L.ARG_TASKS_DISPATCHED, 0) for w in waves) == tasks
    assert all(
        w.args.get(L.ARG_TASKS_DISPATCHED, 0) == w.args.get("dispatched", 0) for w in waves
    )


def test_trace_file_is_not_empty(run: dict[str, Any]) -> None:
    assert Path(run["path"]).stat().st_size > 1000

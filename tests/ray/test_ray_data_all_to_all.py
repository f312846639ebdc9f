"""Ray Data's all-to-all operators, traced from the driver, on real Ray Data (one node).

A random shuffle, a repartition and a sort submit and await their tasks inside
one blocking call of Ray Data's scheduling loop; these tests check that each
of those Ray tasks is in the trace (its stage, function, Ray task id, request,
blocks and rows), that each ran on a worker as Ray's own events say, that
each round's wait is on the loop, and that a failure or a bug in the hooks
never reaches the pipeline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="Ray Data needs pip install -e '.[raydata]'")

import ray
import ray.data
from engines_agree import assert_engines_agree
from ray_data_checks import executions, load_data_trace, only_trace
from ray_trace_checks import RunnerTrace

import tracer.integrations.ray_data as traced_data
from tracer.format.model import Slice, TraceModel
from tracer.integrations.ray_data import _compat
from tracer.ray import layout as L

BLOCKS = 4
ROWS = BLOCKS * 3


@pytest.fixture(autouse=True)
def _shuffle_strategy_kept(ray_data_quiet: None) -> Iterator[None]:
    ctx = ray.data.DataContext.get_current()
    strategy = ctx.shuffle_strategy
    yield
    ctx.shuffle_strategy = strategy


def same(batch: dict[str, Any]) -> dict[str, Any]:
    return batch


def fails_on_7(batch: dict[str, Any]) -> dict[str, Any]:
    if 7 in list(batch["id"]):
        raise ValueError("no 7 here")
    return batch


#: Past the last ~500 characters of its text that Ray's events keep (Ray 2.60 too).
_LONG = "no 7 here: " + "the rest of a long message " * 30


def fails_on_7_at_length(batch: dict[str, Any]) -> dict[str, Any]:
    if 7 in list(batch["id"]):
        raise ValueError(_LONG)
    return batch


def _stage_tasks(rt: RunnerTrace, stage: str) -> list[Slice]:
    return [t for t in rt.task_slices if t.name == stage]


def _awaiting(rt: RunnerTrace) -> list[Slice]:
    return [s for s in rt.loop_slices if s.name == L.SLICE_AWAITING]


def _check_tasks(rt: RunnerTrace, tasks: list[Slice]) -> None:
    """What every all-to-all task carries: its function, Ray's id in this job, a request,
    a dispatched slice, an end."""
    job = ray.get_runtime_context().get_job_id()
    ids = [t.args[L.ARG_RAY_TASK_ID] for t in tasks]
    assert len(set(ids)) == len(ids)
    for task in tasks:
        assert task.dur is not None, task
        assert task.args[L.ARG_RAY_FUNCTION]
        ray_id = task.args[L.ARG_RAY_TASK_ID]
        assert len(ray_id) == 48 and ray_id.endswith(job), ray_id  # Ray's task ids end in the job's
        assert task.args[L.ARG_RESOURCE_REQUEST]["num_cpus"] == 1  # Ray's default
        (dispatched,) = [s for s in rt.dispatched_slices if s.parent_id == task.id]
        assert dispatched.ts == task.ts and dispatched.dur == task.dur


def _check_ran(model: TraceModel, rt: RunnerTrace, tasks: list[Slice]) -> dict[str, Slice]:
    """Each task's execution, drawn from Ray's own events (nothing of ours runs in these
    tasks): on a worker of this node, inside the task's slice, its arrow from the task's
    launch, Ray's phases beside it; no memory (none measured). By task id."""
    execs = {e.args[L.ARG_TASK_ID]: e for e in executions(model)}
    flows_into = {f.dest_id: f.source_id for f in model.flows}
    launched = {m.id: m for track in rt.stage_tracks for m in rt.launches(track)}
    ray_tasks = {
        s.args[L.ARG_TASK_ID]: s for s in model.slices
        if s.category == L.CAT_RAY and s.name.startswith(L.RAY_TASK_PREFIX)
    }
    node = ray.get_runtime_context().get_node_id()
    ran = {}
    for task in tasks:
        task_id = task.args[L.ARG_TASK_ID]
        e = ran[task_id] = execs[task_id]
        assert e.name == task.name and e.dur is not None
        assert e.args[L.ARG_RAY_TASK_ID] == task.args[L.ARG_RAY_TASK_ID]
        assert task.ts <= e.ts and e.ts + e.dur <= task.ts + (task.dur or 0), (task, e)
        assert node[:8] in (rt.node_of(e).name or "")
        assert launched[flows_into[e.id]].args[L.ARG_TASK_ID] == task_id
        assert "memory_peak" not in e.args
        phases = ray_tasks[task_id]  # on the Ray phases lane of the same worker
        assert model.tracks[phases.track_uuid].parent_uuid == e.track_uuid
        assert phases.ts <= e.ts and e.ts + e.dur <= phases.ts + (phases.dur or 0)
    return ran


def _by_function(tasks: list[Slice]) -> dict[str, list[Slice]]:
    out: dict[str, list[Slice]] = {}
    for t in tasks:
        out.setdefault(t.args[L.ARG_RAY_FUNCTION], []).append(t)
    return out


def test_a_random_shuffle_and_the_map_fused_into_it_are_traced(tmp_path: Path) -> None:
    assert traced_data.enable(level=1, path=tmp_path)
    # Seeded: each map splits its 3 rows into BLOCKS slices, one empty, in a random order;
    # unseeded, all maps put the empty one at the same reduce 1 time in 64, and that
    # reduce outputs an empty block (0 bytes). Seed 2 gives every reduce 3 rows.
    rows = ray.data.range(ROWS, override_num_blocks=BLOCKS).map_batches(same).random_shuffle(
        seed=2)
    assert sorted(r["id"] for r in rows.take_all()) == list(range(ROWS))

    path = only_trace(tmp_path)
    model, rt = load_data_trace(path)
    stage = "ReadRange->MapBatches(same)->RandomShuffle"
    assert [t.name for t in rt.stage_tracks] == [f"1: {stage}"]
    (stage_slice,) = rt.stage_slices
    assert stage_slice.args["num_tasks"] == 2 * BLOCKS
    assert len(rt.launches(rt.stage_tracks[0])) == 2 * BLOCKS  # an arrow's start per task
    tasks = _stage_tasks(rt, stage)
    _check_tasks(rt, tasks)
    _check_ran(model, rt, tasks)
    assert len(executions(model)) == len(tasks)
    (read,) = [i for i in model.instants if i.name == L.INSTANT_RAY_EVENTS]
    assert read.args[L.ARG_RAY_EVENTS_MISSING] == 0
    fns = _by_function(tasks)
    assert set(fns) == {"ShuffleTaskSpec.map", "ShuffleTaskSpec.reduce"}
    maps, reduces = fns["ShuffleTaskSpec.map"], fns["ShuffleTaskSpec.reduce"]
    assert len(maps) == len(reduces) == BLOCKS
    node = ray.get_runtime_context().get_node_id()
    for t in maps:  # one input block each (not the fused map's function), split BLOCKS ways
        assert t.args[L.ARG_BLOCKS_IN] == 1 and t.args[L.ARG_BLOCKS_OUT] == BLOCKS
        assert t.args[L.ARG_ROWS_OUT] == ROWS // BLOCKS and t.args[L.ARG_NODE_ID] == node
    for t in reduces:  # a slice of every map's output, one block
        assert t.args[L.ARG_BLOCKS_IN] == BLOCKS and t.args[L.ARG_BLOCKS_OUT] == 1
        assert t.args[L.ARG_BYTES_OUT] > 0 and t.args[L.ARG_ROWS_OUT] == ROWS // BLOCKS
    assert not [t for t in tasks if L.ARG_STATUS in t.args]

    # The loop: each round's wait, inside the wave that ran the exchange.
    map_wait, reduce_wait = _awaiting(rt)
    assert map_wait.args == {L.ARG_WAITING_FOR: "Shuffle Map", L.ARG_TASKS: BLOCKS}
    assert reduce_wait.args == {L.ARG_WAITING_FOR: "Shuffle Reduce", L.ARG_TASKS: BLOCKS}
    (wave,) = [s for s in rt.loop_slices if s.id == map_wait.parent_id]
    assert wave.name == L.SLICE_WAVE and reduce_wait.parent_id == wave.id
    assert wave.args[L.ARG_TASKS_DISPATCHED] == wave.args[L.ARG_TASKS_FINISHED] == 2 * BLOCKS
    map_end = map_wait.ts + (map_wait.dur or 0)
    for t in maps:  # submitted before the wait, seen done when it returned
        assert t.ts <= map_wait.ts and map_end <= t.ts + (t.dur or 0) <= reduce_wait.ts
    for t in reduces:
        assert map_end <= t.ts <= reduce_wait.ts
        assert t.ts + (t.dur or 0) >= reduce_wait.ts + (reduce_wait.dur or 0)
    inflight = rt.counter_values(L.COUNTER_INFLIGHT)
    assert max(inflight) == BLOCKS and inflight[-1] == 0
    assert_engines_agree(path)


def test_a_repartition_without_keys_is_traced_after_the_map_before_it(tmp_path: Path) -> None:
    traced_data.enable(level=1, path=tmp_path)
    ds = ray.data.range(ROWS, override_num_blocks=BLOCKS).map_batches(same).repartition(3)
    assert sorted(r["id"] for r in ds.take_all()) == list(range(ROWS))

    model, rt = load_data_trace(only_trace(tmp_path))
    assert [t.name for t in rt.stage_tracks] == ["1: ReadRange->MapBatches(same)",
                                                 "2: Repartition"]
    # The map before it is traced as ever: measured in its workers.
    measured = {e.args[L.ARG_TASK_ID] for e in executions(model) if "memory_peak" in e.args}
    assert measured == {t.args[L.ARG_TASK_ID] for t in
                        _stage_tasks(rt, "ReadRange->MapBatches(same)")}
    assert len(measured) == BLOCKS
    tasks = _stage_tasks(rt, "Repartition")
    _check_tasks(rt, tasks)
    assert len(_check_ran(model, rt, tasks)) == len(executions(model)) - BLOCKS
    fns = _by_function(tasks)
    assert set(fns) == {"_split_single_block", "ShuffleTaskSpec.reduce"}
    assert len(fns["ShuffleTaskSpec.reduce"]) == 3
    assert sum(t.args[L.ARG_ROWS_OUT] for t in fns["ShuffleTaskSpec.reduce"]) == ROWS
    assert [(s.args[L.ARG_WAITING_FOR], s.args[L.ARG_TASKS]) for s in _awaiting(rt)] == [
        ("Split Repartition", 3)]
    assert not [t for t in tasks if L.ARG_STATUS in t.args]


def test_without_rays_events_the_exchange_tasks_have_no_executions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRACER_RAY_EVENTS=0: nothing is read from Ray; the tasks are traced from the driver
    alone, and the map before the exchange is measured in its workers as ever."""
    monkeypatch.setenv("TRACER_RAY_EVENTS", "0")
    traced_data.enable(level=1, path=tmp_path)
    ds = ray.data.range(ROWS, override_num_blocks=BLOCKS).map_batches(same).repartition(3)
    assert sorted(r["id"] for r in ds.take_all()) == list(range(ROWS))

    model, rt = load_data_trace(only_trace(tmp_path))
    fns = _by_function(_stage_tasks(rt, "Repartition"))  # traced from the driver as ever
    assert set(fns) == {"_split_single_block", "ShuffleTaskSpec.reduce"}
    assert {e.name for e in executions(model)} == {"ReadRange->MapBatches(same)"}
    assert len(executions(model)) == BLOCKS
    assert not [s for s in model.slices if s.category == L.CAT_RAY
                and s.name.startswith(L.RAY_TASK_PREFIX)]
    assert not [t for t in model.tracks.values()
                if t.name in (L.RAY_PHASES_TRACK, L.RAY_STATES_TRACK)]
    assert not [i for i in model.instants if i.name == L.INSTANT_RAY_EVENTS]


@pytest.mark.parametrize("strategy", ["sort_shuffle_pull_based", "sort_shuffle_push_based"])
def test_a_sort_under_either_shuffle_strategy_is_traced(strategy: str, tmp_path: Path) -> None:
    from ray.data.context import ShuffleStrategy

    ray.data.DataContext.get_current().shuffle_strategy = ShuffleStrategy(strategy)
    traced_data.enable(level=1, path=tmp_path)
    ds = ray.data.range(ROWS, override_num_blocks=BLOCKS).map_batches(same).sort(
        "id", descending=True)
    assert [r["id"] for r in ds.take_all()] == list(range(ROWS))[::-1]

    model, rt = load_data_trace(only_trace(tmp_path))
    tasks = _stage_tasks(rt, "Sort")
    _check_tasks(rt, tasks)
    _check_ran(model, rt, tasks)
    fns = _by_function(tasks)
    assert len(fns.pop("_sample_block")) == BLOCKS
    reduces = fns.pop("SortTaskSpec.reduce")
    assert sum(t.args.get(L.ARG_ROWS_OUT, 0) for t in reduces) == ROWS
    waits = Counter(s.args[L.ARG_WAITING_FOR] for s in _awaiting(rt))
    if strategy == "sort_shuffle_pull_based":
        assert set(fns) == {"SortTaskSpec.map"} and len(fns["SortTaskSpec.map"]) == BLOCKS
        assert waits == {"Sort Sample": 1, "Shuffle Map": 1, "Shuffle Reduce": 1}
    else:  # rounds of a map and a merge, each round's maps awaited
        assert set(fns) == {"PushBasedShuffleTaskScheduler.execute.map_partition",
                            "PushBasedShuffleTaskScheduler.execute.merge"}
        assert {"Sort Sample", "Shuffle Map", "Shuffle Reduce"} == set(waits)
    # Every task ended when the driver saw it done: none left unfinished at the end.
    assert not [t for t in tasks if L.ARG_STATUS in t.args]


def test_shuffle_operators_that_report_their_tasks_run_where_rays_events_say(
    tmp_path: Path,
) -> None:
    """The default strategy (``shuffle_v2`` in Ray 2.60: ``HashAggregateMap`` and
    ``HashAggregateReduce``; ``hash_shuffle`` in 2.55: one ``HashAggregate``): a
    groupby's hash-shuffle operators report their tasks to Ray Data's hooks (traced as
    any operator's), but nothing of ours runs in them; their executions come from Ray's
    events, beside the measured map's."""
    traced_data.enable(level=1, path=tmp_path)
    ds = ray.data.range(ROWS, override_num_blocks=BLOCKS).map_batches(same)
    counts = {r["id"]: r["count()"] for r in ds.groupby("id").count().take_all()}
    assert counts == dict.fromkeys(range(ROWS), 1)

    model, rt = load_data_trace(only_trace(tmp_path))
    shuffled = [t for t in rt.task_slices if t.name.startswith("HashAggregate")]
    assert {t.name.split("(")[0] for t in shuffled} in (
        {"HashAggregateMap", "HashAggregateReduce"}, {"HashAggregate"})
    ran = _check_ran(model, rt, shuffled)
    measured = [e for e in executions(model) if "memory_peak" in e.args]
    assert {e.name for e in measured} == {"ReadRange->MapBatches(same)"}
    assert len(measured) + len(ran) == len(executions(model)) == len(rt.task_slices)


@pytest.mark.parametrize("udf", [fails_on_7, fails_on_7_at_length])
def test_a_udf_fused_into_a_shuffle_that_raises(tmp_path: Path, udf: Any) -> None:
    """Its execution, drawn from Ray's events, names the UDF's exception as its task does:
    read out of Ray's text of the error, or, where Ray cut that text before it (a long
    message), as Ray Data raised it to the driver."""

    def pipeline() -> Any:
        return ray.data.range(ROWS, override_num_blocks=BLOCKS).map_batches(
            udf).random_shuffle()

    with pytest.raises(Exception) as untraced:
        pipeline().materialize()
    traced_data.enable(level=1, path=tmp_path)
    with pytest.raises(Exception) as traced:
        pipeline().materialize()
    assert type(traced.value).__name__ == type(untraced.value).__name__
    assert str(traced.value).splitlines()[-1] == str(untraced.value).splitlines()[-1]

    model, rt = load_data_trace(only_trace(tmp_path))
    (run,) = [s for s in rt.loop_slices if s.depth == 0]
    assert "no 7 here" in run.args[L.ARG_ERROR]
    tasks = _stage_tasks(rt, f"ReadRange->MapBatches({udf.__name__})->RandomShuffle")
    assert len(tasks) == BLOCKS  # the reduce round never started
    assert all(t.dur is not None for t in tasks)
    (failed,) = [t for t in tasks if t.args.get(L.ARG_STATUS) == L.STATUS_FAILED]
    assert failed.args[L.ARG_ERROR_TYPE] == "ValueError"
    assert "no 7 here" in failed.args[L.ARG_ERROR]
    # Its execution, from Ray's events, failed where it ran, and is marked there.
    (e,) = _check_ran(model, rt, [failed]).values()
    assert e.args[L.ARG_STATUS] == L.STATUS_FAILED and e.args[L.ARG_ERROR_TYPE] == "ValueError"
    assert e.args[L.ARG_ERROR].startswith("no 7 here")  # the message, as workers report it
    assert len(e.args[L.ARG_ERROR]) <= 500
    (mark,) = [i for i in model.instants if i.name == L.INSTANT_TASK_FAILED
               and i.args[L.ARG_TASK_ID] == failed.args[L.ARG_TASK_ID]]
    assert mark.track_uuid == e.track_uuid
    # The others finished (no status) or were still running when Ray Data gave up.
    assert {t.args.get(L.ARG_STATUS) for t in tasks if t is not failed} <= {
        None, L.STATUS_UNFINISHED}
    (wait,) = _awaiting(rt)
    assert wait.dur is not None and wait.args[L.ARG_WAITING_FOR] == "Shuffle Map"


def test_only_the_bulk_call_thread_tasks_are_traced_and_untraced_runs_are_left_alone(
    tmp_path: Path,
) -> None:
    """Ray tasks another thread submits meanwhile are not the operator's; once the
    hooks are in, an execution that is not traced passes through them untouched."""

    @ray.remote
    def elsewhere() -> int:
        return 1

    def slow(batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.2)
        return batch

    traced_data.enable(level=1, path=tmp_path / "traced")
    stop = threading.Event()
    submitted: list[int] = []

    def other_thread() -> None:
        while not stop.is_set():
            submitted.append(ray.get(elsewhere.remote()))

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        ds = ray.data.range(ROWS, override_num_blocks=BLOCKS).map_batches(slow).random_shuffle()
        assert sorted(r["id"] for r in ds.take_all()) == list(range(ROWS))
    finally:
        stop.set()
        thread.join()
    assert len(submitted) > 3
    _, rt = load_data_trace(only_trace(tmp_path / "traced"))
    functions = Counter(t.args[L.ARG_RAY_FUNCTION] for t in rt.task_slices)
    assert functions == {"ShuffleTaskSpec.map": BLOCKS, "ShuffleTaskSpec.reduce": BLOCKS}

    traced_data.disable()
    ds = ray.data.range(ROWS, override_num_blocks=BLOCKS).random_shuffle()
    assert sorted(r["id"] for r in ds.take_all()) == list(range(ROWS))
    assert len(list(tmp_path.rglob("*.perfetto-trace"))) == 1


def test_a_bug_in_the_hooks_stops_tracing_not_the_shuffle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tracer.format import read_trace

    def broken(fn: Any) -> str:
        raise RuntimeError("a bug in the tracer")

    monkeypatch.setattr(_compat, "function_name", broken)
    traced_data.enable(level=1, path=tmp_path)
    with caplog.at_level(logging.WARNING, logger="tracer"):
        ds = ray.data.range(ROWS, override_num_blocks=BLOCKS).map_batches(same).random_shuffle()
        assert sorted(r["id"] for r in ds.take_all()) == list(range(ROWS))
    assert "tracing stopped for Ray Data execution" in caplog.text
    assert "RuntimeError: a bug in the tracer" in caplog.text
    model = read_trace(only_trace(tmp_path))
    assert {p.kind for p in model.problems} <= {"unterminated_slice"}, model.problems

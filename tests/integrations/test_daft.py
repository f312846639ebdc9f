"""Daft's own legacy RayRunner, traced through ``tracer.integrations.daft``.

Real Daft (0.6.14, the ``daft`` extra) on the tests' real local Ray: Daft's
RayRunner finds Ray initialised and uses that instance. The query runs a UDF
that requests ``memory_bytes`` and allocates three times as much. Skipped
when Daft is not installed (``pip install -e '.[daft]'``; CI installs it).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import threading
import types
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

daft = pytest.importorskip(
    "daft", reason="Daft is not installed: pip install -e '.[daft]' (CI installs it)"
)

import ray  # noqa: E402
from own_driver import heavy, run_driver  # noqa: E402

import tracer.integrations.daft as tdaft  # noqa: E402
from tracer.format import TraceModel, read_trace  # noqa: E402
from tracer.ray import ENV_VAR, default_trace_dir  # noqa: E402
from tracer.ray import layout as L  # noqa: E402
from tracer.ray import wrappers as tracer_wrappers  # noqa: E402

#: What the UDF's tasks ask Ray for, and what the UDF allocates (3x as much).
REQUEST = 8 << 20
ALLOCATED = 3 * REQUEST
ROWS = 40
PARTITIONS = 4


@daft.udf(return_dtype=daft.DataType.int64(), memory_bytes=REQUEST)
def inflate(x: Any) -> list[int]:
    blob = bytearray(ALLOCATED)  # held while the batch is computed
    out = [v * 2 + blob[v % len(blob)] for v in x.to_pylist()]
    del blob
    return out


EXPECTED = [(x, 2 * x) for x in range(ROWS)]


def run_query(**config: Any) -> list[tuple[int, int]]:
    """The query on Daft's legacy Ray runner; its rows, sorted."""
    with daft.execution_config_ctx(use_legacy_ray_runner=True, **config):
        df = daft.from_pydict({"x": list(range(ROWS))}).into_partitions(PARTITIONS)
        out = df.with_column("y", inflate(daft.col("x"))).to_pydict()
    return sorted(zip(out["x"], out["y"], strict=True))


def trace_files() -> set[Path]:
    return set(default_trace_dir().glob(f"{tdaft.RUNNER_NAME}.*"))


def daft_metrics_actors() -> list[dict[str, Any]]:
    """Daft's own tracer's actor (namespace ``daft``), and tracer's metrics actors."""
    return [
        a for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == "daft" or a["name"].startswith("tracer-metrics-")
    ]


@dataclasses.dataclass
class Run:
    rows: list[tuple[int, int]]
    path: Path


@pytest.fixture(scope="module")
def daft_on_ray(ray_local: None) -> Iterator[None]:
    """Daft's Ray runner, on the tests' Ray (it uses the instance already initialised)."""
    daft.set_runner_ray(noop_if_initialized=True)
    yield
    tdaft.uninstall()


def _traced_run(level_env: str | None) -> Run:
    tdaft.install()
    before = trace_files()
    with pytest.MonkeyPatch.context() as mp:
        if level_env is None:
            mp.delenv(ENV_VAR, raising=False)
        else:
            mp.setenv(ENV_VAR, level_env)
        rows = run_query(enable_ray_tracing=True)
    (path,) = trace_files() - before
    return Run(rows, path)


@pytest.fixture(scope="module")
def level_1(daft_on_ray: None) -> Run:
    """Daft's switch alone: level 1."""
    return _traced_run(None)


@pytest.fixture(scope="module")
def level_2(daft_on_ray: None) -> Run:
    """Daft's switch and TRACER_ENABLE_RAY_TRACING=2: memray around every task."""
    return _traced_run("2")


# ------------------------------------------------------------ trace checks


def _only(model: TraceModel, name: str) -> Any:
    (track,) = [t for t in model.tracks.values() if t.name == name]
    return track


def check_daft_trace(run: Run, level: int) -> TraceModel:
    """What Daft's runner traced: waves, tasks with requests, executions, stages."""
    assert run.rows == EXPECTED
    model = read_trace(run.path, strict=True)
    assert not model.problems and not model.truncated
    for s in model.slices:
        assert s.dur is not None and s.dur >= 0, s

    # The dispatch loop of Daft's scheduler, its waves numbered as Daft numbers them.
    scheduler = _only(model, f"{L.SCHEDULER_PROCESS} ({tdaft.RUNNER_NAME})")
    loop = [t for t in model.children(scheduler.uuid) if t.kind == "track"]
    assert [t.name for t in loop] == [L.DISPATCH_LOOP_THREAD]
    on_loop = model.slices_on(loop[0].uuid)
    (execution,) = [s for s in on_loop if s.depth == 0]
    assert execution.name == L.SLICE_EXECUTION
    assert execution.args["runner"] == tdaft.RUNNER_NAME
    assert execution.args["tracing_level"] == level
    assert execution.args[L.ARG_LOST_MEASUREMENTS] == 0
    execution_id = execution.args["execution_id"]
    assert run.path.name.startswith(f"{tdaft.RUNNER_NAME}.{execution_id}.")
    waves = [s for s in on_loop if s.depth == 1]
    assert {s.name for s in waves} == {L.SLICE_WAVE}
    assert [s.args[L.ARG_WAVE] for s in waves] == list(range(1, len(waves) + 1))
    phases = Counter(s.name for s in on_loop if s.depth >= 2)
    for phase in (L.SLICE_PLAN_POLLING, L.SLICE_BATCHING, L.SLICE_DISPATCHING,
                  L.SLICE_AWAITING):
        assert phases[phase] >= 1, phases
    awaits = [s.args for s in on_loop if s.name == L.SLICE_AWAITING]
    assert {"num_returns": 1} in awaits  # Daft's wait for any task, without a timeout
    assert any(a.get("timeout_s") == 0.01 for a in awaits)  # then for all that are ready
    polled = Counter(s.args.get("next_item_type") for s in on_loop
                     if s.name == L.SLICE_PLAN_POLLING)
    assert polled["SingleOutputPartitionTask"] == PARTITIONS, polled

    # Tasks: one per PartitionTask, named after its stage, with its resource request.
    tasks = [s for s in model.slices if s.category == L.CAT_TASK and s.depth == 0]
    by_stage = Counter(s.name for s in tasks)
    assert by_stage == {"FanoutEvenSlices": 1, "Project": PARTITIONS}, by_stage
    for task in tasks:
        request = task.args[L.ARG_RESOURCE_REQUEST]
        memory = REQUEST if task.name == "Project" else 0
        assert request == {"num_cpus": 1, "num_gpus": 0, "memory_bytes": memory}, task
        assert task.args[L.ARG_INSTRUCTIONS] == task.name
        assert re.fullmatch(r"(Single|Multi)OutputPartitionTask_\d+", task.args[L.ARG_TASK_ID])
        assert L.ARG_STATUS not in task.args  # received with its result

    # Executions: one per task, on a worker of the tests' Ray node.
    node_id = ray.get_runtime_context().get_node_id()
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    assert sorted(e.args[L.ARG_TASK_ID] for e in executions) == sorted(
        t.args[L.ARG_TASK_ID] for t in tasks
    )
    task_of = {t.args[L.ARG_TASK_ID]: t for t in tasks}
    for e in executions:
        worker = model.tracks[e.track_uuid]
        assert worker.kind == "track" and (worker.name or "").startswith("worker "), worker
        node = model.parent_of(worker.uuid)
        assert node is not None and node.name == f"{L.NODE_PROCESS_PREFIX} 0 ({node_id[:8]})"
        task = task_of[e.args[L.ARG_TASK_ID]]
        assert e.name == task.name
        assert task.ts < e.ts and e.ts + (e.dur or 0) < task.ts + (task.dur or 0)
        assert e.args[L.ARG_ASSIGNED_RESOURCES]["CPU"] == 1
        assert e.args[L.ARG_MEMORY_REQUESTED] == (REQUEST if e.name == "Project" else 0)

    # Daft's loop counts no tasks in flight: the tracer's own count (dispatched, not yet
    # received, at the end of each phase of the loop where it changed) is drawn, and CPUs
    # available never go below 0.
    counters = {t.name: [c.value for c in model.counters_on(t.uuid)]
                for t in model.tracks.values() if t.kind == "counter"}
    in_flight = counters[L.COUNTER_INFLIGHT]
    assert max(in_flight) >= 1 and in_flight[-1] == 0, in_flight
    # It counts each task up to its receipt, and its CPU as held: Daft dispatches at a
    # wave's start and waits the rest of it, so a count taken at the waves' ends alone
    # (as it was) missed the tasks dispatched and received in one wave, the first among
    # them (a fresh user's review: an idle cluster drawn while it was full).
    steps = {name: [(c.ts, c.value) for c in model.counters_on(_only(model, name).uuid)]
             for name in (L.COUNTER_INFLIGHT, L.COUNTER_AVAILABLE_CPUS)}

    def value_at(name: str, ts: int) -> float | None:
        before = [v for t, v in steps[name] if t <= ts]
        return before[-1] if before else None

    for task in tasks:
        end = task.ts + (task.dur or 0)
        flying, cpus = (value_at(n, end - 1) for n in (L.COUNTER_INFLIGHT,
                                                        L.COUNTER_AVAILABLE_CPUS))
        assert flying is not None and flying >= 1, (task.args, steps)
        assert cpus is not None and cpus <= 1, (task.args, steps)
    assert all(0 <= v <= 2 for v in counters[L.COUNTER_AVAILABLE_CPUS])

    # Stages: Daft's stage ids; an arrow from the stage to each of its executions.
    stages = [s for s in model.slices if s.category == L.CAT_STAGE]
    assert sorted((s.args[L.ARG_STAGE_ID], s.name, s.args["num_tasks"]) for s in stages) == (
        sorted({(t.args[L.ARG_STAGE_ID], t.name, by_stage[t.name]) for t in tasks})
    )
    stage_of = {s.name: s for s in stages}
    assert len(model.flows) == len(executions)
    assert len({f.flow_id for f in model.flows}) == len(executions)  # one per execution
    # Each arrow leaves its stage's 'task launched' mark for that task, nested in the slice.
    launches = {i.id: i for i in model.instants if i.name == L.INSTANT_TASK_LAUNCHED}
    for flow in model.flows:
        dest = model.slice_by_id(flow.dest_id)
        assert dest.category == L.CAT_EXECUTION
        mark = launches[flow.source_id]
        assert mark.parent_id == stage_of[dest.name or ""].id
        assert mark.args[L.ARG_TASK_ID] == dest.args[L.ARG_TASK_ID]
    return model


def test_level_1_daft_switch_traces_the_query(level_1: Run) -> None:
    model = check_daft_trace(level_1, 1)
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    assert all(L.ARG_HEAP_PEAK not in e.args for e in executions)  # no memray at level 1
    # Daft's own tracer is out of the loop: it would have started Daft's metrics actor.
    assert daft_metrics_actors() == []


def test_level_2_measures_each_task_under_memray(level_2: Run) -> None:
    model = check_daft_trace(level_2, 2)
    for e in (s for s in model.slices if s.category == L.CAT_EXECUTION):
        if e.name == "Project":  # the UDF's allocation, 3x the request
            assert ALLOCATED <= e.args[L.ARG_HEAP_PEAK] < ALLOCATED + REQUEST, e.args
            assert e.args[L.ARG_OVER_REQUEST] is True
        else:
            assert e.args[L.ARG_HEAP_PEAK] < REQUEST, e.args
    (project,) = [s for s in model.slices if s.category == L.CAT_STAGE and s.name == "Project"]
    assert project.args[L.ARG_TASKS_OVER_REQUEST] == PARTITIONS
    heaps = [t for t in model.tracks.values() if t.name == L.COUNTER_WORKER_HEAP]
    assert heaps and max(c.value for t in heaps for c in model.counters_on(t.uuid)) >= ALLOCATED
    assert daft_metrics_actors() == []


@pytest.mark.parametrize("level", [1, 2])
def test_traces_load_in_trace_processor(
    level: int, trace_processor_bin: str, request: pytest.FixtureRequest
) -> None:
    """Through the perfetto package's TraceProcessor, as a user would query them
    (every trace of the suite is also checked against tracer's reader by tp_check)."""
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    run: Run = request.getfixturevalue(f"level_{level}")
    tp = TraceProcessor(
        trace=str(run.path), config=TraceProcessorConfig(bin_path=trace_processor_bin)
    )
    try:

        def rows(sql: str) -> list[dict[str, Any]]:
            return [dict(r.__dict__) for r in tp.query(sql)]

        assert rows("SELECT name, idx, severity, value FROM stats WHERE value > 0 "
                    "AND severity IN ('error', 'data_loss')") == []
        executions = rows(
            "SELECT s.name AS stage, node.name AS node, worker.name AS worker, "
            "EXTRACT_ARG(s.arg_set_id, 'debug.memory_requested') AS requested "
            "FROM slice AS s JOIN track AS worker ON worker.id = s.track_id "
            "JOIN track AS node ON node.id = worker.parent_id "
            "WHERE s.category = 'execution'"
        )
        assert Counter(e["stage"] for e in executions) == {
            "Project": PARTITIONS, "FanoutEvenSlices": 1,
        }
        for e in executions:
            assert e["node"].startswith("Node 0 (") and e["worker"].startswith("worker ")
            assert e["requested"] == (REQUEST if e["stage"] == "Project" else 0)
        requests = rows(
            "SELECT EXTRACT_ARG(arg_set_id, 'debug.resource_request.memory_bytes') AS memory "
            "FROM slice WHERE category = 'task' AND depth = 0 AND name = 'Project'"
        )
        assert [r["memory"] for r in requests] == [REQUEST] * PARTITIONS
        (flows,) = rows(
            "SELECT COUNT(*) AS n FROM flow JOIN slice AS mark ON mark.id = flow.slice_out "
            "JOIN slice AS st ON st.id = mark.parent_id "
            "JOIN slice AS ex ON ex.id = flow.slice_in "
            "WHERE st.category = 'stage' AND ex.category = 'execution' AND st.name = ex.name "
            "AND mark.name = 'task launched'"
        )
        assert flows["n"] == PARTITIONS + 1
        (waves,) = rows("SELECT COUNT(*) AS n FROM slice WHERE name = 'wave'")
        assert waves["n"] >= 2
    finally:
        tp.close()


# ------------------------------------------------------------ failures, actor pools


@daft.udf(return_dtype=daft.DataType.int64())
def fail_at_7(x: Any) -> list[int]:
    if 7 in x.to_pylist():
        raise ValueError("no 7s")
    return [v for v in x.to_pylist()]


@daft.udf(return_dtype=daft.DataType.int64(), concurrency=1)
class Triple:
    """A class UDF with a concurrency: Daft runs it on an actor pool."""

    def __init__(self) -> None:
        pass

    def __call__(self, x: Any) -> list[int]:
        return [3 * v for v in x.to_pylist()]


def _run_udf(udf: Any, **config: Any) -> list[int]:
    with daft.execution_config_ctx(use_legacy_ray_runner=True, **config):
        df = daft.from_pydict({"x": list(range(ROWS))}).into_partitions(PARTITIONS)
        return sorted(df.with_column("y", udf(daft.col("x"))).to_pydict()["y"])


def _the_new_trace(before: set[Path]) -> TraceModel:
    (path,) = trace_files() - before
    model = read_trace(path, strict=True)
    assert not model.problems and not model.truncated
    return model


@pytest.mark.usefixtures("daft_on_ray")
def test_a_failing_udf_fails_the_query_as_it_would_untraced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    tdaft.uninstall()
    with pytest.raises(Exception, match="no 7s") as untraced:
        _run_udf(fail_at_7)
    tdaft.install()
    before = trace_files()
    with pytest.raises(Exception, match="no 7s") as traced:
        _run_udf(fail_at_7, enable_ray_tracing=True)
    assert type(traced.value).__name__ == type(untraced.value).__name__
    assert type(traced.value).__name__ == "RayTaskError(UDFException)"
    model = _the_new_trace(before)
    failed = [s for s in model.slices
              if s.category == L.CAT_EXECUTION and s.args.get(L.ARG_STATUS) == L.STATUS_FAILED]
    assert [(s.name, s.args[L.ARG_ERROR_TYPE]) for s in failed] == [("Project", "UDFException")]
    assert "fail_at_7" in failed[0].args[L.ARG_ERROR]
    (execution,) = [s for s in model.slices if s.name == L.SLICE_EXECUTION]
    assert execution.args[L.ARG_LOST_MEASUREMENTS] == 0
    # Daft's loop never gets the result itself: the task's own slice says it failed too.
    failed_tasks = [s for s in model.slices if s.category == L.CAT_TASK and s.depth == 0
                    and s.args.get(L.ARG_STATUS) == L.STATUS_FAILED]
    assert [t.args[L.ARG_TASK_ID] for t in failed_tasks] == [failed[0].args[L.ARG_TASK_ID]]
    assert failed_tasks[0].args[L.ARG_ERROR_TYPE] == "UDFException"
    marks = [i for i in model.instants if i.name == L.INSTANT_TASK_FAILED]
    assert [m.args[L.ARG_TASK_ID] for m in marks] == [failed[0].args[L.ARG_TASK_ID]]


@pytest.mark.usefixtures("daft_on_ray")
def test_actor_pool_tasks_show_from_the_driver_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """Daft submits them to its actors itself (its tracer never traced them either); its
    no-op tasks, done in the loop without Ray, are not Ray tasks."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    tdaft.install()
    before = trace_files()
    assert _run_udf(Triple, enable_ray_tracing=True) == [3 * x for x in range(ROWS)]
    model = _the_new_trace(before)
    tasks = [s for s in model.slices if s.category == L.CAT_TASK and s.depth == 0]
    assert Counter(s.name for s in tasks) == {"FanoutEvenSlices": 1, "ActorPoolProject": 4}
    assert all(L.ARG_STATUS not in s.args for s in tasks)  # none left unfinished
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    assert [s.name for s in executions] == ["FanoutEvenSlices"]


# ------------------------------------------------------------ tracing off


def ray_calls_made() -> tuple[dict[Any, Any], dict[Any, Any]]:
    """tracer.ray's caches of the calls it made (traced, or optioned for an untraced call)."""
    return dict(tracer_wrappers._CALLS), dict(tracer_wrappers._OPTIONED)


def test_tracing_off_runs_as_daft_runs_without_tracer(
    daft_on_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daft's own module, then ours at level 0: the same rows; no file, thread, actor
    or traced function of ours."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    tdaft.uninstall()
    runner = importlib.import_module(tdaft.DAFT_RUNNER_MODULE)
    own = importlib.import_module(tdaft.DAFT_TRACING_MODULE)
    assert own is not tdaft and runner.ray_tracing is own
    baseline = run_query(enable_ray_tracing=False)
    assert baseline == EXPECTED

    tdaft.install()
    assert runner.ray_tracing is tdaft
    assert isinstance(runner.single_partition_pipeline, tdaft._RayFunctionWrapper)
    files, calls = trace_files(), ray_calls_made()
    assert run_query(enable_ray_tracing=False) == baseline
    assert trace_files() == files
    assert ray_calls_made() == calls  # every task submitted as Daft submits it
    assert not [t for t in threading.enumerate() if t.name.startswith("tracer-")]
    assert daft_metrics_actors() == []


@pytest.mark.usefixtures("ray_local")
def test_daft_workers_load_only_what_measures_a_task() -> None:
    """Daft's workers import this module (its task functions are wrapped by it): not the
    driver's tracer with it (the writer, readers, timeline and protobuf: ~25 ms of each
    worker's CPU, ~90 where nothing is compiled to .pyc); nor does the driver at level 0.
    A driver of its own on the tests' Ray: a job of its own, whose workers are fresh."""
    code = """
import ray, daft
ray.init()
import tracer.integrations.daft as t
t.install()
daft.set_runner_ray(noop_if_initialized=True)

@daft.udf(return_dtype=daft.DataType.string())
def loaded(x):
    import sys
    names = " ".join(sorted(m for m in sys.modules if m.startswith("tracer")))
    return [names] * len(x.to_pylist())

def query():
    df = daft.from_pydict({"x": [1, 2]}).into_partitions(2)
    return df.with_column("m", loaded(daft.col("x"))).to_pydict()["m"][0]

import sys
with daft.execution_config_ctx(use_legacy_ray_runner=True, enable_ray_tracing=False):
    query()  # tracing off: the driver loads nothing of the tracer's either
print("DRIVER0", " ".join(sorted(m for m in sys.modules if m.startswith("tracer"))))
with daft.execution_config_ctx(use_legacy_ray_runner=True, enable_ray_tracing=True):
    print("WORKER", query())
"""
    lines = {x.split()[0]: x.split()[1:] for x in run_driver(code) if x.split()}
    driver_off, worker = lines["DRIVER0"], lines["WORKER"]
    assert "tracer.integrations.daft" in driver_off
    assert heavy(driver_off) == [], driver_off
    assert "tracer.integrations.daft" in worker and "tracer.ray.task_metrics" in worker
    assert heavy(worker) == [], worker


# ------------------------------------------------------------ installing


def test_install_before_daft_imports_its_runner() -> None:
    """The usual order: install() right after ``import daft``; the runner imports us."""
    code = """
import sys
import daft
import tracer.integrations.daft as t
from tracer.ray import TracingLevel
t.install()
t.install()  # idempotent
assert t.DAFT_RUNNER_MODULE not in sys.modules
import daft.runners.ray_runner as runner
from daft.runners import ray_tracing
assert runner.ray_tracing is t and ray_tracing is t and t.is_installed()
wrapped = sorted(n for n, v in vars(runner).items() if isinstance(v, t._RayFunctionWrapper))
print(",".join(wrapped))
# DAFT_ENABLE_RAY_TRACING=1 in this process's environment: Daft's switch is on.
assert t.tracing_level(daft.context.get_context().daft_execution_config) == TracingLevel.TIMELINE
t.uninstall()
assert runner.ray_tracing is not t and runner.ray_tracing is sys.modules[t.DAFT_TRACING_MODULE]
assert type(runner.single_partition_pipeline).__module__ == t.DAFT_TRACING_MODULE
"""
    env = {**os.environ, "DAFT_ENABLE_RAY_TRACING": "1"}
    env.pop(ENV_VAR, None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "fanout_pipeline,reduce_and_fanout,reduce_pipeline,single_partition_pipeline"
    ]


def test_install_without_daft_says_what_to_install(tmp_path: Path) -> None:
    """The module imports without Daft (layer 3 names only); install() says what is missing."""
    (tmp_path / "daft.py").write_text(
        'raise ModuleNotFoundError("No module named \'daft\'", name="daft")\n'
    )
    code = """
import tracer.integrations.daft as t
try:
    t.install()
except t.DaftIntegrationError as exc:
    print(exc)
assert not t.is_installed()
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'tracer[daft]'" in done.stdout


@pytest.mark.parametrize(
    ("daft_switch", "env", "level"),
    [(False, None, 0), (True, None, 1), (True, "2", 2), (False, "2", 2), (True, "0", 1),
     (False, "1", 1), (True, "bad", 1), (False, "bad", 0)],
)
def test_tracing_level_from_daft_and_tracer_switches(
    daft_switch: bool, env: str | None, level: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is None:
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, env)
    with daft.execution_config_ctx(enable_ray_tracing=daft_switch):
        config = daft.context.get_context().daft_execution_config
        assert config.enable_ray_tracing is daft_switch
        assert tdaft.tracing_level(config) == level


def test_a_bad_tracer_level_is_warned_about_once_and_runs_untraced(
    daft_on_ray: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As for Ray Data: one warning, and tracer's variable counts as off (Daft's own
    switch still traces, see test_tracing_level_from_daft_and_tracer_switches)."""
    import tracer._env

    monkeypatch.setattr(tracer._env, "_warned", set())  # said once a process: say it here
    monkeypatch.setenv(ENV_VAR, "banana")
    files = trace_files()
    with caplog.at_level("WARNING", logger="tracer"):
        tdaft.install()
        tdaft.install()
        assert run_query(enable_ray_tracing=False) == EXPECTED
    assert tdaft.is_installed()
    assert trace_files() == files
    warned = [r.getMessage() for r in caplog.records if "'banana'" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "invalid $TRACER_ENABLE_RAY_TRACING 'banana'" in warned[0]


FLOTILLA_JOB = """
import io, logging
import ray, daft
ray.init()
import tracer.integrations.daft as t
from tracer.ray import default_trace_dir

said = io.StringIO()
logging.getLogger("tracer").addHandler(logging.StreamHandler(said))
t.install()
daft.set_runner_ray(noop_if_initialized=True)
before = set(default_trace_dir().glob("daft.*"))

def query(**config):
    with daft.execution_config_ctx(enable_ray_tracing=True, **config):
        return daft.from_pydict({"x": [1, 2, 3]}).with_column("y", daft.col("x") + 1).to_pydict()

def told(tag):
    new = set(default_trace_dir().glob("daft.*")) - before
    print(tag, said.getvalue().count("needs Daft's legacy Ray runner"), len(new))

for _ in range(2):
    print("ROWS", query()["y"])
told("FLOTILLA")
print("ROWS", query(use_legacy_ray_runner=True)["y"])
told("LEGACY")
"""


@pytest.mark.usefixtures("ray_local")
def test_tracing_on_daft_default_runner_says_it_needs_the_legacy_one() -> None:
    """Daft's default runner (Flotilla) does not use Daft's tracing module: a query that
    asks for tracing there writes no trace, and one warning per process says how to get
    one. A driver of its own (Flotilla's actors end with its job)."""
    lines = run_driver(FLOTILLA_JOB, DAFT_PROGRESS_BAR="0")
    assert lines.count("ROWS [2, 3, 4]") == 3, lines
    assert "FLOTILLA 1 0" in lines, lines  # two queries, no trace, one warning
    assert "LEGACY 1 1" in lines, lines  # the legacy runner: traced, no other warning


def test_install_refuses_a_runner_it_does_not_recognise(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner module already imported without Daft's names: a clear error, nothing
    left half-installed."""
    tdaft.uninstall()
    before = sys.modules.get(tdaft.DAFT_TRACING_MODULE)
    other = types.ModuleType(tdaft.DAFT_RUNNER_MODULE)
    other.ray_tracing = before  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, tdaft.DAFT_RUNNER_MODULE, other)
    with pytest.raises(tdaft.DaftIntegrationError, match="before Daft's first query"):
        tdaft.install()
    assert not tdaft.is_installed()
    assert sys.modules.get(tdaft.DAFT_TRACING_MODULE) is before
    assert other.ray_tracing is before  # type: ignore[attr-defined]


@ray.remote
def triple(x: int) -> int:
    return 3 * x


def test_a_call_with_daft_own_tracer_is_made_as_daft_made_it(
    daft_on_ray: None, tmp_path: Path
) -> None:
    """An execution that started before install() holds Daft's own tracer: our task
    functions call it as Daft's did (its dispatch recorded in Daft's JSON file)."""
    tdaft.uninstall()
    own = importlib.import_module(tdaft.DAFT_TRACING_MODULE)
    task = types.SimpleNamespace(id=lambda: "SingleOutputPartitionTask_7")
    path = tmp_path / "daft.json"
    with path.open("w") as f:
        daft_tracer = own.RunnerTracer(f, None)
        call = tdaft.ray_remote_traced(triple).options(num_cpus=1).with_tracing(daft_tracer, task)
        assert ray.get(call.remote(5)) == 15
        daft_tracer._writer.write_footer()
    events = json.loads(path.read_text())
    assert [(e["name"], e["id"]) for e in events if e.get("ph") == "b"] == [
        ("task_dispatch", "SingleOutputPartitionTask_7")
    ]

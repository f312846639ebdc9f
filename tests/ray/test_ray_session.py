"""Opening traces: levels, level 0, default output path, concurrent executions, trace_processor."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from ray_trace_checks import check_runner_trace, load

from tracer.errors import InvalidTracingLevelError
from tracer.ray import (
    ENV_VAR,
    NullRunnerTracer,
    RayFunctionWrapper,
    RunnerTracer,
    default_trace_dir,
    ray_tracer,
)
from tracer.ray import layout as L
from tracer.runner import Pipeline, Stage

pytestmark = pytest.mark.usefixtures("ray_local")


def _inc(x: int) -> int:
    return x + 1


def _nap(x: int) -> int:
    time.sleep(0.01)
    return x


@ray.remote
def _plain(x: int) -> int:
    return x * 3


def _tracer_actors() -> list[str]:
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return [n for n in names if n.startswith("tracer-metrics-")]


@pytest.fixture
def no_level_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


# --------------------------------------------------------------------- level 0


@pytest.mark.usefixtures("no_level_env")
def test_level_0_writes_nothing_and_starts_nothing(tmp_path: Path) -> None:
    before = set(default_trace_dir().glob("*")) if default_trace_dir().exists() else set()
    path = tmp_path / "off.perfetto-trace"
    for level in (0, "0", "off", None):  # None: the unset environment variable
        with ray_tracer(level=level, path=path, metrics_actor=True) as tracer:
            assert isinstance(tracer, NullRunnerTracer)
            assert not tracer.enabled and tracer.trace_path is None
            assert not _tracer_actors()
            # Every call is accepted and does nothing; wrapped calls run untraced.
            with tracer.dispatch_wave(0) as update:
                update(anything=1)
                tracer.task_created("t", 0, {"num_cpus": 1}, "x")
                fn = RayFunctionWrapper.wrap(_plain).with_tracing(tracer, "t")
                assert ray.get(fn.remote(2)) == 6
                tracer.task_received_as_ready("t")
    pipeline = Pipeline([1, 2, 3], [Stage("inc", _inc)])
    assert pipeline.run(tracing_level=0, trace_path=path, progress=False) == [2, 3, 4]
    assert pipeline.run(progress=False) == [2, 3, 4]  # level from the (unset) env var
    assert pipeline.trace_path is None
    assert not path.exists()
    after = set(default_trace_dir().glob("*")) if default_trace_dir().exists() else set()
    assert after == before


# ------------------------------------------------------------- invalid levels


@pytest.mark.usefixtures("no_level_env")
@pytest.mark.parametrize(
    "level", [3, -1, "5", "verbose", True, 1.5, "\u00b2", "\u0661"]  # non-ASCII digits too
)
def test_invalid_level_argument(level: Any, tmp_path: Path) -> None:
    path = tmp_path / "bad.perfetto-trace"
    with pytest.raises(InvalidTracingLevelError) as info:
        Pipeline([1], [Stage("inc", _inc)]).run(tracing_level=level, trace_path=path)
    message = str(info.value)
    assert repr(level) in message
    assert "0 (off)" in message and "1 (timeline)" in message and "2 (memory)" in message
    assert not path.exists()


@pytest.mark.parametrize("value", ["9", "maybe", "level1"])
def test_invalid_level_env_var(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, value)
    path = tmp_path / "bad.perfetto-trace"
    with pytest.raises(InvalidTracingLevelError) as info:
        Pipeline([1], [Stage("inc", _inc)]).run(trace_path=path)
    message = str(info.value)
    assert f"${ENV_VAR}" in message and repr(value) in message
    assert "0 (off), 1 (timeline), 2 (memory)" in message
    assert not path.exists()


# --------------------------------------------------------- default output path


def test_default_path_from_env_var_level(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "1")
    pipeline = Pipeline([1, 2], [Stage("inc", _inc)])
    assert pipeline.run(execution_id="exec 42/x", runner_name="my-runner", progress=False) == [2, 3]
    path = Path(pipeline.trace_path)
    session = Path(ray._private.worker.global_worker.node.get_session_dir_path())
    assert path.parent == session / "logs" / "tracer"
    assert re.fullmatch(r"my-runner\.exec_42_x\.\d{8}T\d{6}\.\d{6}\.perfetto-trace", path.name)
    rt = check_runner_trace(path, {"inc": 2})
    assert rt.scheduler.name == f"{L.SCHEDULER_PROCESS} (my-runner)"


_BEFORE_RAY_INIT = """
import sys
import ray
from tracer.ray import ray_tracer

with ray_tracer("early", runner_name="r", level=1) as tracer:
    tracer.count_inflight_tasks(0)
    print(tracer.trace_path)
assert not ray.is_initialized()  # the tracer started no Ray of its own
"""


def test_a_tracer_opened_before_ray_init_says_so_and_writes_where_it_says(
    tmp_path: Path,
) -> None:
    """Opened before ``ray.init()`` (its documented precondition), a tracer wrote into
    ``/tmp/ray/session_latest``: the machine's last session, one that had ended, and
    warned at the close that Ray "was shut down". It now says Ray is not initialised,
    and writes to the temp dir's ``tracer/`` folder, whose path the warning names."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("TRACER_TRACE_DIR", ENV_VAR)}
    env["TMPDIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", _BEFORE_RAY_INIT], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    path = Path(out.stdout.strip())
    assert path.parent == tmp_path / "tracer"
    assert "Ray is not initialised: call ray.init() before ray_tracer()" in out.stderr
    assert str(path) in out.stderr and "shut down" not in out.stderr
    assert load(path).slices[0].name == L.SLICE_EXECUTION


def test_an_execution_id_that_is_not_a_string_is_its_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner numbering its executions passes an int: it raised at level 1 (the default
    path is made from it), and only there."""
    monkeypatch.setenv("TRACER_TRACE_DIR", str(tmp_path))
    for given, name in ((42, "42"), (0, "0")):
        with ray_tracer(given, runner_name="counted", level=1) as tracer:  # type: ignore[arg-type]
            assert tracer.execution_id == name
        path = Path(tracer.trace_path)
        assert path.parent == tmp_path and path.name.startswith(f"counted.{name}.")
        assert load(path).slices[0].args["execution_id"] == name


def test_ray_tracer_yields_a_runner_tracer(tmp_path: Path) -> None:
    path = tmp_path / "direct.perfetto-trace"
    with ray_tracer("direct", level="timeline", path=path) as tracer:
        assert isinstance(tracer, RunnerTracer)
        assert tracer.trace_path == path and tracer.execution_id == "direct"
        assert tracer.level == 1
    model = load(path)
    assert model.slices[0].name == L.SLICE_EXECUTION


def test_a_run_is_traced_in_microseconds(tmp_path: Path) -> None:
    """Runs are recorded in µs (tracer.ray.output.TIME_UNIT_NS): the incremental clock
    counts µs, so every delta is a byte or two shorter than in ns (a level-1 trace of
    no-op tasks ~15% smaller compressed), and what comes back is still ns."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as perfetto_pb2

    path = tmp_path / "us.perfetto-trace"
    with ray_tracer("us", level="timeline", path=path, compress=False) as tracer:
        tracer.count_inflight_tasks(1)
    trace = perfetto_pb2.Trace()
    trace.ParseFromString(path.read_bytes())
    clocks = {c.clock_id: c for p in trace.packet if p.HasField("clock_snapshot")
              for c in p.clock_snapshot.clocks}
    assert clocks[64].is_incremental and clocks[64].unit_multiplier_ns == 1000
    model = load(path)
    assert all(s.ts % 1000 == 0 for s in model.slices)
    assert model.counters and all(c.ts % 1000 == 0 for c in model.counters)


# ------------------------------------------------------ concurrent executions


def test_concurrent_executions_in_threads(tmp_path: Path) -> None:
    """Three dispatch loops in threads of one driver: each trace holds its own execution only."""
    runs = {f"job{i}": (i + 2, tmp_path / f"job{i}.perfetto-trace") for i in range(3)}
    results: dict[str, Any] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(runs))

    def run(name: str, n: int, path: Path) -> None:
        try:
            stages = [Stage(f"{name}-a", _nap), Stage(f"{name}-b", _inc)]
            start.wait()
            results[name] = Pipeline(list(range(n)), stages).run(
                tracing_level=1, trace_path=path, execution_id=name, progress=False
            )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k, *v)) for k, v in runs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    loop_tids = set()
    for name, (n, path) in runs.items():
        assert results[name] == [i + 1 for i in range(n)]
        rt = check_runner_trace(path, {f"{name}-a": n, f"{name}-b": n})
        (execution,) = [s for s in rt.loop_slices if s.depth == 0]
        assert execution.args["execution_id"] == name
        loop_tids.add(execution.args["tid"])
    assert len(loop_tids) == len(runs)  # each loop ran (and is shown) on its own thread


# ------------------------------------------------------------- trace_processor


_STATS_PREFIXES = ("interned_data", "track_event", "misplaced", "flow", "clock_sync_failure")


def test_trace_processor_loads_a_runner_trace(tmp_path: Path, trace_processor_bin: str) -> None:
    bin_path = trace_processor_bin
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    path = tmp_path / "tp.perfetto-trace"
    stages = [Stage("first", _nap), Stage("second", _inc, memory_bytes=1 << 20)]
    Pipeline(list(range(4)), stages).run(tracing_level=1, trace_path=path, progress=False)
    tp = TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=bin_path))
    try:

        def rows(sql: str) -> list[Any]:
            return list(tp.query(sql))

        bad = rows(
            "select name, idx, severity, value from stats where value > 0 and ("
            + " or ".join(f"name like '{p}%'" for p in _STATS_PREFIXES)
            + " or severity in ('error', 'data_loss'))"
        )
        assert not bad, [(r.name, r.idx, r.severity, r.value) for r in bad]
        categories = {r.category for r in rows("select distinct category from slice")}
        assert categories == {L.CAT_SCHEDULER, L.CAT_TASK, L.CAT_STAGE, L.CAT_EXECUTION}
        assert not rows("select id from slice where dur < 0")
        names = {r.name for r in rows("select name from slice where category = 'task'")}
        assert names == {"first", "second", L.SLICE_DISPATCHED}
        executions = rows("select id, name from slice where category = 'execution'")
        assert len(executions) == 8
        flows = rows(
            "select sp.name as src, so.name as mark, so.category as src_cat, si.name as dst, "
            "si.category as dst_cat from flow f join slice so on so.id = f.slice_out "
            "join slice sp on sp.id = so.parent_id join slice si on si.id = f.slice_in"
        )
        assert len(flows) == 8
        assert {(f.src_cat, f.dst_cat) for f in flows} == {(L.CAT_STAGE, L.CAT_EXECUTION)}
        assert all(f.src == f.dst and f.mark == L.INSTANT_TASK_LAUNCHED for f in flows)
        # Plain tracks only: no process or thread (the UI would append synthetic ids).
        assert not rows("select name from process where upid != 0")
        assert not rows("select name from thread where utid != 0")
        tracks = {r.name for r in rows("select name from track where name is not null")}
        assert {L.TASKS_TRACK, L.STAGES_TRACK, L.TASK_LANE, "0: first", "1: second",
                f"{L.SCHEDULER_PROCESS} (pipeline)", L.DISPATCH_LOOP_THREAD} <= tracks
        assert any(t.startswith(L.NODE_PROCESS_PREFIX + " ") for t in tracks)
        assert any(t.startswith(L.WORKER_THREAD_PREFIX + " ") for t in tracks)
        counters = {r.name for r in rows("select name from counter_track")}
        assert {L.COUNTER_INFLIGHT, L.COUNTER_AVAILABLE_CPUS} <= counters
        args = rows(
            "select extract_arg(arg_set_id, 'debug.task_id') as task_id, "
            "extract_arg(arg_set_id, 'debug.resource_request.memory_bytes') as mem "
            "from slice where category = 'task' and depth = 0 and name = 'second'"
        )
        assert sorted(a.task_id for a in args) == [f"1-{i}" for i in range(4)]
        assert {a.mem for a in args} == {1 << 20}
        inflight = rows(
            "select value from counter c join counter_track t on c.track_id = t.id "
            f"where t.name = '{L.COUNTER_INFLIGHT}' order by c.ts"
        )
        assert inflight[-1].value == 0 and max(r.value for r in inflight) > 0
    finally:
        tp.close()

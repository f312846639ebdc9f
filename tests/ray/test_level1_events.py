"""Level 1's executions drawn from Ray's own task events, on a real Ray.

A traced task returns only its own values; Ray's events bring where and
when it ran, and the RSS it put in a profile event of Ray's. These tests
check that the trace has every execution, measured, where Ray ran it; that
failures, cancels and what never came are said; and that the return channel
is still there for those who choose it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray_trace_checks import load

from tracer.format.model import TraceModel
from tracer.ray import RayFunctionWrapper, ray_tracer
from tracer.ray import layout as L
from tracer.ray.task_metrics import pack_failure, pack_rss, unpack_rss
from tracer.ray.timeline.awaited import Awaited, measurements
from tracer.ray.timeline.ray_phases import RayTaskEvents
from tracer.runner import Pipeline, Stage

N = 8


def _grow(x: int) -> bytes:
    return bytes(8 << 20)  # 8 MiB: the task's RSS rises by that much, at least


def _size(b: bytes) -> int:
    return len(b)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.setenv("TRACER_EXECUTIONS", "ray_events")
    monkeypatch.delenv("TRACER_RAY_EVENTS", raising=False)
    yield monkeypatch


def _executions(model: TraceModel) -> list[Any]:
    return [s for s in model.slices if s.category == L.CAT_EXECUTION]


def _read_counts(model: TraceModel) -> dict[str, Any]:
    (read,) = [i for i in model.instants if i.name == L.INSTANT_RAY_EVENTS]
    return dict(read.args)


def test_executions_come_from_rays_events_with_node_worker_and_rss(
    ray_local: None, tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "run.perfetto-trace"
    out = Pipeline(list(range(N)), [Stage("grow", _grow), Stage("size", _size)]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    assert out == [8 << 20] * N
    model = load(path)
    executions = _executions(model)
    assert len(executions) == 2 * N, _read_counts(model)
    assert len({e.args[L.ARG_TASK_ID] for e in executions}) == 2 * N
    node_ids = {n["NodeID"] for n in ray.nodes()}
    for e in executions:
        # On the worker Ray ran it on: a track under a node track named by Ray's node id.
        worker = model.tracks[e.track_uuid]
        assert worker.parent_uuid is not None
        node = model.tracks[worker.parent_uuid]
        while node.parent_uuid is not None and not any(n[:8] in node.name for n in node_ids):
            node = model.tracks[node.parent_uuid]
        assert any(n[:8] in node.name for n in node_ids), node.name
        assert e.args[L.ARG_RAY_TASK_ID]
        assert e.dur > 0
        # The RSS the task reported in its profile event: requested vs actual.
        assert e.args[L.ARG_MEMORY_PEAK] > 8 << 20
        assert e.args[L.ARG_MEMORY_REQUESTED] == 0
    # The measured span sits inside Ray's own execute phase of the same task.
    spans = {s.args[L.ARG_TASK_ID]: s for s in model.slices
             if s.category == L.CAT_RAY and (s.name or "").startswith(L.RAY_TASK_PREFIX)}
    for e in executions:
        span = spans[e.args[L.ARG_TASK_ID]]
        assert span.ts <= e.ts and e.end_ts is not None and span.end_ts is not None
        assert e.end_ts <= span.end_ts
    # Each stage's memory summary counts every one of its executions.
    stages = [s for s in model.slices if s.category == L.CAT_STAGE and s.dur]
    assert {s.name for s in stages} == {"grow", "size"}
    for stage in stages:
        assert stage.args["num_tasks"] == N
        assert stage.args[L.ARG_MEMORY_PEAK]["min"] > 8 << 20
    assert _read_counts(model)[L.ARG_RAY_EVENTS_MISSING] == 0
    assert L.ARG_EXECUTIONS_MISSING not in _read_counts(model)
    # The memory counters, written once the executions came: each worker's RSS (at
    # every execution's start and end) and each node's summed task peaks.
    counters: dict[str, list[int]] = {}
    for c in model.counters:
        counters.setdefault(model.tracks[c.track_uuid].name, []).append(int(c.value))
    assert len(counters[L.COUNTER_WORKER_RSS]) >= 2
    assert max(counters[L.COUNTER_NODE_MEMORY_USED]) > 8 << 20


def _fail_odd(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd partition {x}")
    return x


def test_a_failed_task_is_drawn_failed_where_it_ran(
    ray_local: None, tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    """The tracer reads no value of the task's: Ray's events say it failed, and the task's
    profile event says why."""
    path = tmp_path / "fail.perfetto-trace"
    with pytest.raises(ValueError, match="odd partition"):
        Pipeline(list(range(4)), [Stage("fail_odd", _fail_odd)]).run(
            tracing_level=1, trace_path=path, progress=False
        )
    model = load(path)
    executions = _executions(model)
    assert len(executions) == 4
    failed = [e for e in executions if e.args.get(L.ARG_STATUS) == L.STATUS_FAILED]
    assert len(failed) == 2
    for e in failed:
        assert e.args[L.ARG_ERROR_TYPE] == "ValueError"  # what the body raised, as it said
        assert "odd partition" in e.args[L.ARG_ERROR]
    marks = [i for i in model.instants if i.name == L.INSTANT_TASK_FAILED]
    assert {m.track_uuid for m in marks} <= {e.track_uuid for e in failed}
    assert len(marks) == 2


def test_events_that_never_come_are_counted_and_nothing_waits(
    ray_local: None, tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    """A close with no budget for Ray's last events: the executions still awaited are
    counted missing, the stages are written all the same, the run is not delayed."""
    env.setenv("TRACER_RAY_EVENTS_BUDGET_S", "0")
    path = tmp_path / "missing.perfetto-trace"
    Pipeline(list(range(N)), [Stage("double", _double)]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    model = load(path)
    counts = _read_counts(model)
    drawn = len(_executions(model))
    missing = counts.get(L.ARG_EXECUTIONS_MISSING, 0)
    assert drawn + missing == N
    assert missing > 0  # the run is far shorter than Ray's 1 s report interval
    assert counts[L.ARG_RAY_EVENTS_MISSING] >= missing
    (stage,) = [s for s in model.slices if s.category == L.CAT_STAGE and s.dur]
    assert stage.args["num_tasks"] == N
    # Every task's own slice is there, received, whatever came of its execution.
    lanes = [s for s in model.slices if s.category == L.CAT_TASK and s.name == "double"]
    assert len(lanes) == N


def _boom(x: int) -> int:
    raise ValueError(f"bad partition {x}")


def _plus_one(x: int) -> int:
    return x + 1


def test_a_runner_reporting_failures_itself_gets_the_failed_input_named(
    ray_local: None, tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    """The tracer finds no failure here; a runner that reads its results reports them
    (``task_failed``). The downstream task's error holds what the upstream measured: it is
    told apart by Ray's task id, kept at dispatch, and drawn as failed upstream."""
    path = tmp_path / "upstream.perfetto-trace"
    with ray_tracer("upstream", level=1, path=path) as tracer:
        for task_id, stage in (("0-0", 0), ("1-0", 1)):
            tracer.task_created(task_id, stage, {"num_cpus": 1})
        up = RayFunctionWrapper.wrap(ray.remote(_boom)).with_tracing(tracer, "0-0").remote(3)
        down = RayFunctionWrapper.wrap(ray.remote(_plus_one)).with_tracing(
            tracer, "1-0").remote(up)
        for task_id, ref in (("0-0", up), ("1-0", down)):
            with pytest.raises(ValueError, match="bad partition 3") as raised:
                ray.get(ref, timeout=30)
            tracer.task_failed(task_id, raised.value)
    model = load(path)
    tasks = {s.args[L.ARG_TASK_ID]: s for s in model.slices
             if s.category == L.CAT_TASK and s.depth == 0}
    assert tasks["0-0"].args[L.ARG_STATUS] == L.STATUS_FAILED
    assert tasks["1-0"].args[L.ARG_STATUS] == L.STATUS_FAILED_UPSTREAM
    assert tasks["1-0"].args[L.ARG_UPSTREAM_TASK_ID] == "0-0"
    assert [e.args[L.ARG_TASK_ID] for e in _executions(model)] == ["0-0"]


def _sleepy(folder: str, x: int) -> int:
    with open(os.path.join(folder, "started"), "w"):
        pass
    for _ in range(600):  # 30 s, in steps a cancel can interrupt
        time.sleep(0.05)
    return x


def _double(x: int) -> int:
    return 2 * x


def test_a_cancelled_running_task_is_drawn_cancelled(
    ray_local: None, tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cancel.perfetto-trace"
    with ray_tracer("cancel", path=path, level=1) as tracer:
        assert tracer.via_ray_events
        tracer.task_created("t", 0, {"num_cpus": 1})
        fn = RayFunctionWrapper.wrap(ray.remote(_sleepy)).with_tracing(tracer, "t")
        ref = fn.remote(str(tmp_path), 1)
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        ray.cancel(ref)
        tracer.task_cancelled("t")
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(ref, timeout=30)
    model = load(path)
    (e,) = _executions(model)
    assert e.args[L.ARG_STATUS] == L.STATUS_CANCELLED
    # What the body saw (Ray records the task as finished: the task said it was stopped).
    assert e.args[L.ARG_ERROR_TYPE] in ("KeyboardInterrupt", "TaskCancelledError")
    assert e.dur < 20_000_000_000  # stopped by the cancel, not run to its end


def test_the_return_channel_by_default_and_without_rays_events(
    ray_local: None, tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    """The default (``TRACER_EXECUTIONS`` unset or ``returns``), or Ray's events switched
    off: each task returns its measurements; the executions are the same facts."""
    for setting in ({"TRACER_EXECUTIONS": ""}, {"TRACER_EXECUTIONS": "returns"},
                    {"TRACER_RAY_EVENTS": "0"}):
        for key, value in setting.items():
            env.setenv(key, value)
        path = tmp_path / f"{'-'.join(f'{k}={v}' for k, v in setting.items())}.perfetto-trace"
        with ray_tracer("returns", path=path, level=1) as tracer:
            assert not tracer.via_ray_events
            tracer.task_created("t", 0, {"num_cpus": 1})
            fn = RayFunctionWrapper.wrap(ray.remote(_grow)).with_tracing(tracer, "t")
            ref = fn.remote(1)
            assert len(ray.get(ref)) == 8 << 20
            tracer.tasks_received_as_ready(["t"])
        (e,) = _executions(load(path))
        assert e.args[L.ARG_MEMORY_PEAK] > 8 << 20
        env.setenv("TRACER_EXECUTIONS", "ray_events")
        env.delenv("TRACER_RAY_EVENTS", raising=False)


def test_a_bad_executions_setting_warns_and_uses_the_default(
    env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tracer.ray.events_channel import executions_source

    env.setenv("TRACER_EXECUTIONS", "carrier-pigeon")
    assert executions_source() == "returns"
    assert "TRACER_EXECUTIONS" in caplog.text


# ------------------------------------------------------------ plain facts, no Ray


def test_rss_figures_round_trip_and_reject_anything_else() -> None:
    text = pack_rss(1, 2**40, 3).decode()
    assert unpack_rss(text) == {"rss_start": 1, "rss_end": 2**40, "rss_peak": 3}
    failed = {"rss_start": 1, "rss_end": 2, "rss_peak": 3, "error_type": "ValueError",
              "error": 'bad "quoted" \u00e9 text'}
    assert unpack_rss(pack_failure(failed).decode()) == failed
    for bad in ("", "{}", "1 2 3", "[1, 2, 3]", '{"rss_start": 1, "rss_end": 2}',
                '{"rss_start": 1, "rss_end": 2, "rss_peak": "3"}'):
        assert unpack_rss(bad) == {}


class _Task:
    def __init__(self, task_id: str, stage_id: int = 0, dispatch_ts: int = 10) -> None:
        self.task_id, self.stage_id, self.dispatch_ts = task_id, stage_id, dispatch_ts


def _ev(attempt: int = 0, *, states: tuple[str, ...] = (L.STATE_RUNNING, L.STATE_FINISHED),
        span: bool = True, error_type: str = "", in_worker: bool = False) -> RayTaskEvents:
    return RayTaskEvents(
        "ab" * 24, attempt, "f", "n" * 56, 42,
        states=tuple((s, 100 + i) for i, s in enumerate(states)),
        span=(50, 200) if span else None,
        phases=((L.PHASE_EXECUTE, 60, 190),) if span else (),
        measured=(70, 180) if span else None, rss=(1, 2, 3) if span else None,
        error_type=error_type, failed_in_worker=in_worker,
    )


def test_a_task_settles_once_its_last_attempt_has_ended_and_reported() -> None:
    waiting = Awaited()
    task = _Task("t")
    waiting.add(task, "ab" * 24)  # type: ignore[arg-type]
    assert waiting.since() == 10 and waiting.waiting_in(0) == 1
    # Finished, the worker's phases not in yet: not settled.
    assert list(waiting.settle([_ev(span=False)], final=False)) == []
    assert list(waiting.settle([_ev(states=(L.STATE_FINISHED,), span=False)], False)) == []
    # Failed in its worker, which will report it: not settled without its phases.
    raised = _ev(states=(L.STATE_SUBMITTED, L.STATE_RUNNING, L.STATE_FAILED), span=False,
                 error_type="ValueError", in_worker=True)
    assert list(waiting.settle([raised], final=False)) == []
    # An earlier attempt complete, the last still running: not settled.
    assert list(waiting.settle([_ev(0), _ev(1, states=(L.STATE_RUNNING,))], False)) == []
    # A killed worker never reports: its FAILED attempt settles without phases.
    killed = _ev(0, states=(L.STATE_RUNNING, L.STATE_FAILED), span=False,
                 error_type="OutOfMemoryError")
    ((got, attempts),) = list(waiting.settle([killed], final=False))
    assert got is task and attempts == [killed]
    assert len(waiting) == 0 and waiting.waiting_in(0) == 0 and waiting.since() is None
    assert measurements(killed) is None  # no body ran to the trace's knowledge: a mark
    # Failed before any worker had it (its input failed, or cancelled): settled at once.
    waiting.add(task, "ab" * 24)  # type: ignore[arg-type]
    never = _ev(states=(L.STATE_PENDING_ARGS, L.STATE_FAILED), span=False,
                error_type="RayTaskError", in_worker=True)
    assert [t for t, _ in waiting.settle([never], final=False)] == [task]


def test_an_execution_is_the_tracers_own_span_with_its_rss() -> None:
    m = measurements(_ev(2, states=(L.STATE_RUNNING, L.STATE_FAILED),
                         error_type="RayTaskError"))
    assert m is not None
    assert (m["start_ns"], m["end_ns"], m["pid"], m["attempt"]) == (70, 180, 42, 2)
    assert (m["rss_start"], m["rss_end"], m["rss_peak"]) == (1, 2, 3)
    assert m["error_type"] == "RayTaskError"


def test_whatever_is_left_settles_at_the_end_and_the_rest_is_given_up() -> None:
    waiting = Awaited()
    waiting.add(_Task("a"), "ab" * 24)  # type: ignore[arg-type]
    waiting.add(_Task("b"), "cd" * 24)  # type: ignore[arg-type]
    # Finished, its worker's report never came: settled at the end, its execution missing.
    settled = list(waiting.settle([_ev(span=False)], final=True))
    assert [t.task_id for t, _ in settled] == ["a"]
    assert waiting.missing == 1
    assert [t.task_id for t in waiting.give_up()] == ["b"]
    assert waiting.missing == 2 and len(waiting) == 0
    # What did come in the end is drawn, and not counted missing.
    waiting.add(_Task("c"), "ab" * 24)  # type: ignore[arg-type]
    late = _ev(states=(L.STATE_RUNNING,))  # the worker's report, not yet the owner's
    assert [t.task_id for t, _ in waiting.settle([late], final=True)] == ["c"]
    assert waiting.missing == 2



def test_a_failed_task_s_last_execution_says_the_error_its_producer_read() -> None:
    """Ray's text of an error may be cut before what the body raised: the producer's
    reading of the task's failure is what its last attempt's execution says, when that
    attempt failed in its worker; an earlier attempt, or one Ray killed, keeps Ray's."""
    waiting = Awaited()
    waiting.add(_Task("t"), "ab" * 24, ("ValueError", "no 7 here"))  # type: ignore[arg-type]
    first = _ev(0, states=(L.STATE_RUNNING, L.STATE_FAILED), error_type="OutOfMemoryError")
    cut = _ev(1, states=(L.STATE_RUNNING, L.STATE_FAILED), error_type="UserCodeException",
              in_worker=True)
    ((_, attempts),) = list(waiting.settle([cut, first], final=False))
    assert [(a.attempt, a.error_type, a.error) for a in attempts] == [
        (0, "OutOfMemoryError", ""), (1, "ValueError", "no 7 here")]
    m = measurements(attempts[-1])
    assert m is not None and (m["error_type"], m["error"]) == ("ValueError", "no 7 here")
    # Killed in the end (its worker never reported): Ray's error stands.
    waiting.add(_Task("k"), "ab" * 24, ("ValueError", "x"))  # type: ignore[arg-type]
    killed = _ev(0, states=(L.STATE_RUNNING, L.STATE_FAILED), span=False,
                 error_type="OutOfMemoryError")
    ((_, attempts),) = list(waiting.settle([killed], final=False))
    assert attempts[-1].error_type == "OutOfMemoryError"
    assert not waiting._errors

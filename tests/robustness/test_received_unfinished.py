"""A runner that reports a task received before it finished: the loop never waits for it.

The tracer reads a received task's measurements without waiting: a task
still running is kept, its slice ends where the runner received it (marked
``received_unfinished``), one warning per execution says so, and its
execution is drawn with its true length once it finished, before the close.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from trace_checks import (
    execution_slice,
    executions_by_task,
    instants_named,
    load_complete,
    tasks_by_id,
)

from tracer.format import read_trace
from tracer.format.model import TraceModel
from tracer.ray import RayFunctionWrapper, ResourceRequest, ray_tracer, return_channel
from tracer.ray import layout as L

pytestmark = pytest.mark.usefixtures("ray_local")

SLEEP_S = 3.0


@ray.remote(num_cpus=1)
def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _tracer_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records
        if r.name == "tracer" and r.levelno >= logging.WARNING
    ]


def _dispatch(rt: Any, task_id: str, seconds: float) -> Any:
    rt.task_created(task_id, 0, ResourceRequest(num_cpus=1), "slow")
    return RayFunctionWrapper.wrap(slow).with_tracing(rt, task_id).remote(seconds)


def _stage_slices(model: TraceModel) -> list[Any]:
    return [s for s in model.slices if s.category == L.CAT_STAGE and s.dur is not None]


def test_task_received_before_it_finished_is_not_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    path = tmp_path / "early.perfetto-trace"
    with ray_tracer("early", level=1, path=path) as rt:
        with rt.dispatch_wave(0):
            refs = [_dispatch(rt, f"slow-{i}", SLEEP_S) for i in range(2)]
            start = time.monotonic()
            rt.task_received_as_ready("slow-0")
            assert rt.tasks_received_as_ready(["slow-1"]) == {}
            received_s = time.monotonic() - start
            wave_start = time.monotonic()
        wave_end_s = time.monotonic() - wave_start
        start = time.monotonic()
        rt.stage_done(0)  # completes slow-1 too: its slice waits for their executions
        stage_done_s = time.monotonic() - start
        assert received_s < 1 and wave_end_s < 1 and stage_done_s < 1, (
            received_s, wave_end_s, stage_done_s,
        )
        warnings = _tracer_warnings(caplog)
        assert len(warnings) == 1, warnings  # once per execution, naming the first task
        assert "slow-0" in warnings[0] and L.ARG_RECEIVED_UNFINISHED in warnings[0]

        assert ray.get(refs, timeout=60) == [SLEEP_S, SLEEP_S]
        # Drawn once finished, before the close: the flusher's next pass (within ~1 s).
        deadline = time.monotonic() + 10
        while True:
            model = read_trace(path)
            executions = executions_by_task(model)
            if (len(executions) == 2 and _stage_slices(model)) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert set(executions) == {"slow-0", "slow-1"}
        for (execution,) in executions.values():
            assert execution.dur is not None and execution.dur >= SLEEP_S * 1e9
        (stage,) = _stage_slices(model)
        assert stage.args["num_tasks"] == 2 and L.ARG_MEMORY_PEAK in stage.args
        start = time.monotonic()
    assert time.monotonic() - start < 5  # nothing left to wait for

    assert len(_tracer_warnings(caplog)) == 1
    model = load_complete(path)
    tasks = tasks_by_id(model)
    for task_id, (execution,) in executions_by_task(model).items():
        (task,) = tasks[task_id]
        # Its slice ends where it was received, well before its execution ended.
        assert task.args[L.ARG_RECEIVED_UNFINISHED] is True
        assert L.ARG_STATUS not in task.args
        assert task.dur is not None and execution.dur is not None
        assert task.ts + task.dur + 1e9 < execution.ts + execution.dur
    assert execution_slice(model).args[L.ARG_LOST_MEASUREMENTS] == 0
    assert not instants_named(model, L.INSTANT_METRICS_LOST)


def test_task_not_finished_by_the_close_is_lost_after_a_bounded_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the close waits for a task received unfinished, up to the channel's timeout."""
    caplog.set_level(logging.WARNING, logger="tracer")
    monkeypatch.setattr(return_channel, "METRICS_TIMEOUT_S", 1.0)
    path = tmp_path / "never.perfetto-trace"
    ref = None
    try:
        with ray_tracer("never", level=1, path=path) as rt:
            with rt.dispatch_wave(0):
                ref = _dispatch(rt, "forever", 60)
                start = time.monotonic()
                rt.task_received_as_ready("forever")
            assert time.monotonic() - start < 0.5
            close_start = time.monotonic()
        assert time.monotonic() - close_start < 5
    finally:
        if ref is not None:
            ray.cancel(ref, force=True)
    warnings = _tracer_warnings(caplog)
    assert len(warnings) == 1 and "forever" in warnings[0], warnings
    model = load_complete(path)
    (task,) = tasks_by_id(model)["forever"]
    assert task.args[L.ARG_RECEIVED_UNFINISHED] is True
    assert not executions_by_task(model)
    (lost,) = instants_named(model, L.INSTANT_METRICS_LOST)
    assert lost.args[L.ARG_TASK_ID] == "forever"
    assert lost.args[L.ARG_REASON] == "the task had not finished by the close"
    assert execution_slice(model).args[L.ARG_LOST_MEASUREMENTS] == 1


def test_task_received_unfinished_and_read_once_finished_is_marked_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Received while running, and finished by the time its batch was read (a fresh
    user's loop that marked every task in flight received): the same mark and warning,
    where it had neither and its pickup came out negative; no pickup in the analysis."""
    from engines_agree import assert_engines_agree

    from tracer.query import QueryConfig, TraceQuery

    caplog.set_level(logging.WARNING, logger="tracer")
    path = tmp_path / "late.perfetto-trace"
    with ray_tracer("late", level=1, path=path) as rt, rt.dispatch_wave(0):
        quick = _dispatch(rt, "quick", 0)
        ray.get(quick)
        rt.task_received_as_ready("quick")  # read at once: the first of the run
        ref = _dispatch(rt, "late", 0.3)
        rt.task_received_as_ready("late")  # batched: not read yet
        ray.get(ref)
        assert rt.complete_received() == {}
    warnings = _tracer_warnings(caplog)
    assert len(warnings) == 1 and "late" in warnings[0], warnings
    model = load_complete(path)
    tasks = tasks_by_id(model)
    assert tasks["late"][0].args[L.ARG_RECEIVED_UNFINISHED] is True
    assert L.ARG_RECEIVED_UNFINISHED not in tasks["quick"][0].args
    for engine in ("reader", "trace_processor"):
        with TraceQuery(path, QueryConfig(engine=engine)) as q:
            latency = q.task_latency().set_index("task_id")
        assert latency.loc["quick", "pickup_ns"] >= 0
        assert latency.isna().loc["late", "pickup_ns"], latency.loc["late"]
        assert latency.loc["late", "running_ns"] >= 0.3e9
    assert_engines_agree(path)

"""Lost measurements: the metrics actor dies, or hangs, in the middle of a run.

A Daft-style dispatch loop whose tasks measure themselves with
``collect_ray_task_metrics`` (the actor channel). The run must neither hang
nor fail; the trace must say which tasks' measurements were lost, and still
be complete and valid.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
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

from tracer.format.model import TraceModel
from tracer.ray import ResourceRequest, actor_channel, collect_ray_task_metrics, ray_tracer
from tracer.ray import layout as L
from tracer.ray.metrics_actor import NAMESPACE, actor_name

pytestmark = pytest.mark.usefixtures("ray_local")

NUM_TASKS = 30


@ray.remote(num_cpus=1)
def measured(execution_id: str, task_id: str, x: int) -> int:
    """A task body as in Daft: it measures itself and reports through the actor."""
    with collect_ray_task_metrics(execution_id, task_id, 0, level=1):
        time.sleep(0.02)
        return x * 10


def _run(
    tracer: Any, on_received: Callable[[int], None], num_tasks: int = NUM_TASKS
) -> tuple[dict[str, int], list[float]]:
    """Waves of: create and dispatch up to 4 tasks in flight, wait, receive.

    ``on_received(n)`` is called after each wave with the number of tasks received
    so far. Returns the results and every wave's duration.
    """
    todo = list(range(num_tasks))
    inflight: dict[Any, str] = {}
    results: dict[str, int] = {}
    durations: list[float] = []
    wave = 0
    while todo or inflight:
        start = time.monotonic()
        with tracer.dispatch_wave(wave) as wave_metrics:
            batch = []
            with tracer.dispatch_batching():
                while todo and len(inflight) + len(batch) < 4:
                    i = todo.pop(0)
                    tracer.task_created(f"t{i}", 0, ResourceRequest(num_cpus=1), "measured")
                    batch.append(i)
            with tracer.dispatching():
                for i in batch:
                    tracer.task_dispatched(f"t{i}")
                    inflight[measured.remote(tracer.execution_id, f"t{i}", i)] = f"t{i}"
            with tracer.awaiting(1, 2.0):
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=2.0)
            for ref in ready:
                task_id = inflight.pop(ref)
                results[task_id] = ray.get(ref, timeout=10)
                tracer.task_received_as_ready(task_id)
            wave_metrics(dispatched=len(batch), received=len(ready))
        durations.append(time.monotonic() - start)
        on_received(len(results))
        wave += 1
    tracer.stage_done(0)
    return results, durations


def _actor(execution_id: str) -> Any:
    return ray.get_actor(actor_name(execution_id), namespace=NAMESPACE)


def _actor_up(execution_id: str) -> None:
    """Wait until the execution's metrics actor has started (a run does not wait for it)."""
    ray.get(_actor(execution_id).ready.remote(), timeout=60)


def _check_every_task_measured_or_lost(model: TraceModel, num_tasks: int) -> list[str]:
    """Each task has exactly one execution or one lost-measurements instant; returns the lost."""
    executions = executions_by_task(model)
    lost = [i.args[L.ARG_TASK_ID] for i in instants_named(model, L.INSTANT_METRICS_LOST)]
    assert len(lost) == len(set(lost)), lost
    assert all(len(e) == 1 for e in executions.values()), executions
    assert set(executions).isdisjoint(lost)
    assert set(executions) | set(lost) == {f"t{i}" for i in range(num_tasks)}
    assert execution_slice(model).args[L.ARG_LOST_MEASUREMENTS] == len(lost)
    # The tasks themselves are all there, received, with no status (they did not fail).
    tasks = tasks_by_id(model)
    assert len(tasks) == num_tasks
    assert all(len(t) == 1 and L.ARG_STATUS not in t[0].args for t in tasks.values())
    return lost


def _tracer_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records
        if r.name == "tracer" and r.levelno >= logging.WARNING
    ]


def test_metrics_actor_killed_mid_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    path = tmp_path / "killed-actor.perfetto-trace"
    killed_at: list[int] = []

    def kill_after_a_third(received: int) -> None:
        if received >= NUM_TASKS // 3 and not killed_at:
            ray.kill(_actor("killed-actor"), no_restart=True)
            killed_at.append(received)

    start = time.monotonic()
    with ray_tracer("killed-actor", level=1, path=path, metrics_actor=True) as tracer:
        _actor_up("killed-actor")  # the premise: it worked for the first third
        results, _ = _run(tracer, kill_after_a_third)
    assert results == {f"t{i}": 10 * i for i in range(NUM_TASKS)}
    assert killed_at
    assert time.monotonic() - start < 30  # no hang

    model = load_complete(path)
    lost = _check_every_task_measured_or_lost(model, NUM_TASKS)
    # Every task dispatched after the kill reported to a dead actor: lost. (A task received
    # after the kill may still be measured: the loop receives one result a wave, and the
    # actor may have been drained of its report before.) At the kill, at most 4 tasks past
    # those received had been dispatched.
    assert {f"t{i}" for i in range(killed_at[0] + 4, NUM_TASKS)} <= set(lost)
    assert len(lost) < NUM_TASKS
    (gone,) = instants_named(model, L.INSTANT_METRICS_ACTOR_LOST)
    assert "ActorDiedError" in gone.args[L.ARG_REASON]
    warnings = _tracer_warnings(caplog)
    assert len(warnings) == 1 and "metrics actor" in warnings[0], warnings


def test_metrics_actor_killed_before_it_started(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An actor that dies before it started is lost like one that dies later: the run
    and the rest of the trace go on, and every report sent to it is counted lost."""
    caplog.set_level(logging.WARNING, logger="tracer")
    path = tmp_path / "stillborn-actor.perfetto-trace"
    with ray_tracer("stillborn-actor", level=1, path=path, metrics_actor=True) as tracer:
        ray.kill(_actor("stillborn-actor"), no_restart=True)
        results, _ = _run(tracer, lambda _: None)
    assert results == {f"t{i}": 10 * i for i in range(NUM_TASKS)}
    model = load_complete(path)
    lost = _check_every_task_measured_or_lost(model, NUM_TASKS)
    assert len(lost) == NUM_TASKS  # every report went to the dead actor
    (gone,) = instants_named(model, L.INSTANT_METRICS_ACTOR_LOST)
    assert "ActorDiedError" in gone.args[L.ARG_REASON]
    warnings = _tracer_warnings(caplog)
    assert len(warnings) == 1 and "metrics actor" in warnings[0], warnings


def test_metrics_actor_that_hangs_costs_one_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stopped (SIGSTOP) actor never answers: one wave waits for the timeout, no other."""
    caplog.set_level(logging.WARNING, logger="tracer")
    monkeypatch.setattr(actor_channel, "ACTOR_TIMEOUT_S", 1.0)
    path = tmp_path / "hung-actor.perfetto-trace"
    stopped: list[int] = []

    def stop_after_a_third(received: int) -> None:
        if received >= NUM_TASKS // 3 and not stopped:
            pid = ray.get(_actor("hung-actor").pid.remote(), timeout=10)
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)

    try:
        with ray_tracer("hung-actor", level=1, path=path, metrics_actor=True) as tracer:
            _actor_up("hung-actor")  # the premise: it worked for the first third
            results, durations = _run(tracer, stop_after_a_third)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    assert results == {f"t{i}": 10 * i for i in range(NUM_TASKS)}
    slow = [d for d in durations if d >= 0.9]
    assert len(slow) == 1, durations
    assert sum(durations) < 15

    model = load_complete(path)
    lost = _check_every_task_measured_or_lost(model, NUM_TASKS)
    assert 0 < len(lost) < NUM_TASKS
    (gone,) = instants_named(model, L.INSTANT_METRICS_ACTOR_LOST)
    assert "GetTimeoutError" in gone.args[L.ARG_REASON]
    assert len(_tracer_warnings(caplog)) == 1


def test_measurements_still_on_their_way_at_close_are_waited_for(tmp_path: Path) -> None:
    """A task's fire-and-forget report may land after the runner received its result:
    the close waits a little for it instead of calling it lost."""
    path = tmp_path / "last-tasks.perfetto-trace"
    with ray_tracer("last-tasks", level=1, path=path, metrics_actor=True) as tracer:
        # Receive each result at once: the reports of the last wave race the close.
        results, _ = _run(tracer, lambda _: None, num_tasks=8)
    assert len(results) == 8
    model = load_complete(path)
    assert _check_every_task_measured_or_lost(model, 8) == []
    assert len(model.flows) == 8

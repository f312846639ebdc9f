"""A runner that shuts Ray down with its tracer still open: the close asks Ray nothing.

Ray's ``get``, ``wait``, ``kill`` and an actor's calls start a new local
cluster once ``ray.shutdown()`` was called (Ray's auto-init): the tracer's
close took ~10 s and left the program a Ray it never asked for, so that its
own next ``ray.init`` failed. Now the measurements not read by then are
recorded as lost, and the trace says so. Each test starts its own local Ray
(it shuts it down), and removes whatever Ray is left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from trace_checks import execution_slice, instants_named, load_complete

from tracer.ray import (
    RayFunctionWrapper,
    ResourceRequest,
    collect_ray_task_metrics,
    ray_tracer,
)
from tracer.ray import layout as L
from tracer.ray.connection import RAY_SHUT_DOWN

NUM_TASKS = 4
#: The close, with nothing to ask Ray, takes milliseconds; generous for a loaded machine.
CLOSE_LIMIT_S = 5.0


@pytest.fixture
def own_ray(ray_manager: Any) -> Iterator[None]:
    """A local Ray this test shuts down; any Ray left afterwards (one the tracer started)
    is shut down too, and the next module that needs one starts it again."""
    ray_manager.local()
    try:
        yield
    finally:
        ray_manager.shutdown()


@ray.remote
def _double(x: int) -> int:
    return x * 2


@ray.remote(num_cpus=1)
def _measures_itself(execution_id: str, task_id: str, x: int) -> int:
    with collect_ray_task_metrics(execution_id, task_id, 0, level=1):
        return x * 2


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records
        if r.name == "tracer" and r.levelno == logging.WARNING
    ]


def _check_lost(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every task's measurements recorded as lost to the shutdown; one warning said so."""
    model = load_complete(path)
    lost = instants_named(model, L.INSTANT_METRICS_LOST)
    assert sorted(i.args[L.ARG_TASK_ID] for i in lost) == [f"t{i}" for i in range(NUM_TASKS)]
    assert {i.args[L.ARG_REASON] for i in lost} == {RAY_SHUT_DOWN}
    assert execution_slice(model).args[L.ARG_LOST_MEASUREMENTS] == NUM_TASKS
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "Ray was shut down" in warnings[0], warnings


@pytest.mark.usefixtures("own_ray")
def test_closing_after_ray_shutdown_starts_no_ray_and_records_the_loss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Received tasks whose measurements were not fetched yet (the return channel)."""
    caplog.set_level(logging.WARNING, logger="tracer")
    path = tmp_path / "shutdown.perfetto-trace"
    ids = [f"t{i}" for i in range(NUM_TASKS)]
    with ray_tracer("shutdown", level=1, path=path) as tracer:
        assert tracer.enabled
        refs = []
        for i, task_id in enumerate(ids):
            tracer.task_created(task_id, 0, ResourceRequest(num_cpus=1), "double")
            refs.append(RayFunctionWrapper.wrap(_double).with_tracing(tracer, task_id).remote(i))
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=60)
        assert len(ready) == NUM_TASKS
        # A fetch now (of nothing): the next is due 200 ms later, so the tasks received
        # next are not fetched before the shutdown.
        tracer.tasks_received_as_ready([])
        tracer.tasks_received_as_ready(ids)
        ray.shutdown()  # e.g. the runner's cleanup on its way out
        closing = time.monotonic()
    closed_in = time.monotonic() - closing
    assert not ray.is_initialized()
    assert closed_in < CLOSE_LIMIT_S
    _check_lost(path, caplog)


@pytest.mark.usefixtures("own_ray")
def test_closing_after_ray_shutdown_with_a_metrics_actor_starts_no_ray(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Tasks that measure themselves (the actor channel): neither draining the actor nor
    removing it (``ray.kill``) may start a Ray."""
    caplog.set_level(logging.WARNING, logger="tracer")
    path = tmp_path / "shutdown-actor.perfetto-trace"
    ids = [f"t{i}" for i in range(NUM_TASKS)]
    with ray_tracer("shutdown-actor", level=1, metrics_actor=True, path=path) as tracer:
        refs = []
        for i, task_id in enumerate(ids):
            tracer.task_created(task_id, 0, ResourceRequest(num_cpus=1), "measured")
            tracer.task_dispatched(task_id)
            refs.append(_measures_itself.remote("shutdown-actor", task_id, i))
        assert ray.get(refs, timeout=60) == [i * 2 for i in range(NUM_TASKS)]
        tracer.tasks_received_as_ready(ids)
        ray.shutdown()
        closing = time.monotonic()
    closed_in = time.monotonic() - closing
    assert not ray.is_initialized()
    assert closed_in < CLOSE_LIMIT_S
    _check_lost(path, caplog)
    (gone,) = instants_named(load_complete(path), L.INSTANT_METRICS_ACTOR_LOST)
    assert gone.args[L.ARG_REASON] == RAY_SHUT_DOWN


_UNCLOSED_DRIVER = r"""
import sys, time
import ray
from tracer.ray import RayFunctionWrapper, ResourceRequest, ray_tracer

ray.init(address="local", num_cpus=2, object_store_memory=78643200, include_dashboard=False)

@ray.remote
def work(x):
    time.sleep(0.01)
    return x * 2

if sys.argv[2] == "kept":
    session = ray_tracer("unclosed", runner_name="custom", level=1, path=sys.argv[1])
    tracer = session.__enter__()  # and never session.__exit__
else:  # the manager dropped at once: its generator is closed as it is collected
    tracer = ray_tracer("unclosed", runner_name="custom", level=1, path=sys.argv[1]).__enter__()
results = []
for wave in range(20):
    with tracer.dispatch_wave(wave) as m:
        tracer.task_created(f"t{wave}", 0, ResourceRequest(num_cpus=1), "map")
        with tracer.dispatching():
            ref = RayFunctionWrapper.wrap(work).with_tracing(tracer, f"t{wave}").remote(wave)
        with tracer.awaiting(num_returns=1, timeout=5):
            ray.wait([ref], num_returns=1, timeout=5)
        tracer.tasks_received_as_ready([f"t{wave}"])
        results.append(ray.get(ref))
        m(dispatched=1)
print("RESULTS", results == [2 * w for w in range(20)], flush=True)
# exits here: the tracer is never closed
"""


@pytest.mark.parametrize("manager", ["kept", "dropped"])
def test_a_driver_that_exits_with_its_tracer_open_leaves_a_whole_trace(
    manager: str, tmp_path: Path
) -> None:
    """It used to leave the last second out, slices that never ended, and a warning blaming
    an ImportError at the interpreter's shutdown (or hang there). With the manager dropped
    at once, the tracer was closed as it was collected: every call after it did nothing."""
    import os
    import subprocess
    import sys

    script = tmp_path / "driver.py"
    script.write_text(_UNCLOSED_DRIVER)
    path = tmp_path / "unclosed.perfetto-trace"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "TRACER_"))}
    env["RAY_AUTH_MODE"] = "disabled"
    proc = subprocess.run([sys.executable, str(script), str(path), manager], capture_output=True,
                          text=True, timeout=180, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "RESULTS True" in proc.stdout
    assert "still open; closing it" in proc.stderr
    assert "ImportError" not in proc.stderr and "Traceback" not in proc.stderr
    model = load_complete(path)  # every slice ended, no problems
    run = execution_slice(model)
    assert run.args[L.ARG_ERROR_TYPE] == "DriverExitedError"
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    assert len(executions) == 20
    assert not instants_named(model, L.INSTANT_METRICS_LOST)


def test_ray_shutdown_tells_a_trace_still_being_finished_to_ask_ray_nothing(
    own_ray: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace still being finished once ``ray.shutdown()``'s wait for it ran out (dozens
    of them after back-to-back runs) kept asking Ray as its core worker went: Ray said
    "The core worker has already been shutdown" and the driver exited (a fresh user's
    review, 3 times in 3). Now the thread is told to ask Ray nothing more, while Ray is
    still up, and the shutdown waits (bounded) for it to leave; a later ray.init is
    asked as ever."""
    from tracer.ray import finishing
    from tracer.ray.connection import ray_connected

    monkeypatch.setenv("TRACER_RAY_EVENTS_BUDGET_S", "0.3")
    seen: dict[str, Any] = {}

    def finish() -> None:  # a trace whose reads of Ray's events go on and on
        start = time.monotonic()
        while ray_connected() and time.monotonic() - start < 60:
            time.sleep(0.01)
        seen["ray_up_when_told"] = ray.is_initialized()
        seen["after_s"] = time.monotonic() - start

    finishing.finish_in_background(tmp_path / "long.perfetto-trace", finish)
    start = time.monotonic()
    ray.shutdown()
    assert time.monotonic() - start < 10
    assert seen["ray_up_when_told"] is True, seen  # told before Ray went down
    assert 0.25 <= seen["after_s"] < 10, seen
    assert finishing.wait_for_traces(timeout=0)
    ray.init(num_cpus=1, object_store_memory=78643200, include_dashboard=False)
    assert ray_connected()  # the shutdown's word does not outlive it

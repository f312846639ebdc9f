"""Task failures on real Ray: exceptions, crashed and retried attempts, cancellations.

Each shows as such on the task (its slice's status and attempts) and on the
execution tracks (an execution per attempt whose measurements can be known, a
mark on the worker otherwise), and the trace stays complete and valid.

What can be known (see ``tracer.ray.runner_tracer``): Ray retries a crashed
attempt transparently, so only its number is known (``unmeasured_attempts``);
an attempt that raised and was retried reports itself through the metrics
actor, which the reference runner starts when a stage retries exceptions.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import pytest
import ray
from engines_agree import assert_engines_agree
from trace_checks import (
    execution_slice,
    executions_by_task,
    instants_named,
    load_complete,
    tasks_by_id,
    track_path,
)

from tracer.query import QueryConfig, TraceQuery, records
from tracer.ray import RayFunctionWrapper, ResourceRequest, ray_tracer
from tracer.ray import layout as L
from tracer.runner import Pipeline, PipelineTimeoutError, Stage

pytestmark = pytest.mark.usefixtures("ray_local")

N = 4


def _first_attempt(folder: str, x: int) -> bool:
    """True the first time partition ``x`` gets here (a marker file remembers it)."""
    path = os.path.join(folder, f"attempted-{x}")
    if os.path.exists(path):
        return False
    with open(path, "w"):
        pass
    return True


def _crash_once_on_2(folder: str, x: int) -> int:
    if x == 2 and _first_attempt(folder, x):
        os._exit(1)  # the worker dies: Ray retries the task
    return x * 10


def _crash_always_on_2(x: int) -> int:
    if x == 2:
        os._exit(1)
    return x * 10


def _raise_once_on_1(folder: str, x: int) -> int:
    if x == 1 and _first_attempt(folder, x):
        raise ValueError("first attempt of 1")
    return x * 10


def _raise_always_on_3(x: int) -> int:
    if x == 3:
        raise KeyError("always 3")
    return x * 10


def _slow(x: int) -> int:
    for _ in range(400):  # 20 s, in steps a cancel can interrupt
        time.sleep(0.05)
    return x


def _slow_marked(folder: str, x: int) -> int:
    """``_slow``, leaving a marker file when it starts (so a test knows it ran)."""
    with open(os.path.join(folder, f"started-{x}"), "w"):
        pass
    return _slow(x)


@ray.remote(num_cpus=1)
def _rendezvous(folder: str, name: str) -> int:
    """Runs until another ``_rendezvous`` in ``folder`` runs too: two at once, two workers."""
    open(os.path.join(folder, name), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.getpid()


def _warm_two_workers(folder: Path) -> None:
    """Two workers that have imported this module.

    A cold worker imports this module, and with it the tracer and the test
    helpers, before it runs a task of it: seconds on a loaded machine, long
    enough for a short timeout to cancel tasks that never started.
    """
    folder.mkdir()
    pids = set(ray.get([_rendezvous.remote(str(folder), n) for n in "ab"], timeout=120))
    assert len(pids) == 2, pids


@pytest.fixture
def markers(tmp_path: Path) -> str:
    """A folder for the tasks' marker files (tasks get it as their first argument)."""
    folder = tmp_path / "markers"
    folder.mkdir()
    return str(folder)


def test_exception_without_retry(tmp_path: Path) -> None:
    path = tmp_path / "raise.perfetto-trace"
    stages = [Stage("explode", _raise_always_on_3), Stage("after", abs)]
    with pytest.raises(KeyError, match="always 3"):
        Pipeline(list(range(N)), stages).run(tracing_level=1, trace_path=path, progress=False)
    model = load_complete(path)
    tasks = tasks_by_id(model)
    (failed,) = tasks["0-3"]
    assert failed.args[L.ARG_STATUS] == L.STATUS_FAILED
    assert failed.args[L.ARG_ERROR_TYPE] == "KeyError"
    assert L.ARG_RAY_ATTEMPTS not in failed.args  # exceptions are not retried by default
    (downstream,) = tasks["1-3"]
    assert downstream.args[L.ARG_STATUS] == L.STATUS_FAILED_UPSTREAM
    assert downstream.args[L.ARG_UPSTREAM_TASK_ID] == "0-3"
    executions = executions_by_task(model)
    (execution,) = executions["0-3"]
    assert execution.args[L.ARG_STATUS] == L.STATUS_FAILED
    assert "1-3" not in executions  # never ran
    assert execution_slice(model).args[L.ARG_ERROR_TYPE] == "KeyError"
    (mark,) = instants_named(model, L.INSTANT_TASK_FAILED)
    assert mark.track_uuid == execution.track_uuid  # on the worker where it ran
    assert_engines_agree(path)


def test_crashed_attempt_is_retried_and_counted(tmp_path: Path, markers: str) -> None:
    path = tmp_path / "crash.perfetto-trace"
    stage = Stage("crashy", functools.partial(_crash_once_on_2, markers), max_retries=2)
    results = Pipeline(list(range(N)), [stage]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    assert results == [x * 10 for x in range(N)]
    model = load_complete(path)
    tasks = tasks_by_id(model)
    (retried,) = tasks["0-2"]
    assert L.ARG_STATUS not in retried.args  # it succeeded in the end
    assert retried.args[L.ARG_RAY_ATTEMPTS] == 2
    assert retried.args[L.ARG_UNMEASURED_ATTEMPTS] == 1  # the crashed one: nothing measured
    executions = executions_by_task(model)
    (execution,) = executions["0-2"]  # only the attempt that returned is measured
    assert execution.args[L.ARG_RAY_ATTEMPT] == 1
    for task_id in ("0-0", "0-1", "0-3"):
        assert L.ARG_RAY_ATTEMPTS not in tasks[task_id][0].args
        assert L.ARG_RAY_ATTEMPT not in executions[task_id][0].args
    assert len(model.flows) == N
    # The crashed attempt, from Ray's events: why, and that Ray ran it again (both engines).
    for engine in ("reader", "trace_processor"):
        (row,) = records(TraceQuery(path, QueryConfig(engine=engine)).task_retries())
        assert (row["task_id"], row["status"], row["ray_attempts"]) == ("0-2", "ok", 2)
        assert (row["unmeasured_attempts"], row["failed_attempts_seen"]) == (1, 1), row
        assert row["error_type"] == "WorkerCrashedError", row


def test_crash_without_retry_is_a_failure_on_the_worker(tmp_path: Path) -> None:
    path = tmp_path / "crash-no-retry.perfetto-trace"
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        Pipeline(list(range(N)), [Stage("crashy", _crash_always_on_2, max_retries=0)]).run(
            tracing_level=1, trace_path=path, progress=False
        )
    model = load_complete(path)
    (failed,) = tasks_by_id(model)["0-2"]
    assert failed.args[L.ARG_STATUS] == L.STATUS_FAILED
    assert failed.args[L.ARG_ERROR_TYPE] == "WorkerCrashedError"
    assert "0-2" not in executions_by_task(model)
    # Ray's error for a crashed worker does not say where it ran: the mark is on the loop.
    (mark,) = instants_named(model, L.INSTANT_TASK_FAILED)
    assert mark.args[L.ARG_TASK_ID] == "0-2"
    assert mark.args[L.ARG_ERROR_TYPE] == "WorkerCrashedError"
    assert track_path(model, mark)[-1] == L.DISPATCH_LOOP_THREAD
    assert execution_slice(model).args[L.ARG_ERROR_TYPE] == "WorkerCrashedError"


@pytest.mark.parametrize("retry", [True, [ValueError]], ids=["all", "listed"])
def test_retried_exception_shows_every_attempt(
    tmp_path: Path, markers: str, retry: bool | list[type[BaseException]]
) -> None:
    """retry_exceptions: the attempt that raised is an execution of its own (reported
    through the metrics actor); the one that succeeded follows it."""
    path = tmp_path / "retry-exceptions.perfetto-trace"
    flaky = functools.partial(_raise_once_on_1, markers)
    stage = Stage("flaky", flaky, max_retries=2, retry_exceptions=retry)
    results = Pipeline(list(range(N)), [stage, Stage("inc", abs)]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    assert results == [x * 10 for x in range(N)]
    model = load_complete(path)
    (task,) = tasks_by_id(model)["0-1"]
    assert L.ARG_STATUS not in task.args
    assert task.args[L.ARG_RAY_ATTEMPTS] == 2
    assert task.args[L.ARG_UNMEASURED_ATTEMPTS] == 0
    first, second = executions_by_task(model)["0-1"]
    assert first.args[L.ARG_STATUS] == L.STATUS_FAILED
    assert first.args[L.ARG_ERROR_TYPE] == "ValueError"
    assert "first attempt of 1" in first.args[L.ARG_ERROR]
    assert L.ARG_RAY_ATTEMPT not in first.args  # attempt 0
    assert L.ARG_STATUS not in second.args and second.args[L.ARG_RAY_ATTEMPT] == 1
    assert first.ts + (first.dur or 0) <= second.ts
    (mark,) = instants_named(model, L.INSTANT_TASK_FAILED)
    assert mark.track_uuid == first.track_uuid
    # One arrow per task, to its first execution.
    assert len(model.flows) == 2 * N
    assert execution_slice(model).args[L.ARG_LOST_MEASUREMENTS] == 0
    assert_engines_agree(path)
    # The retried tasks' table says why the first attempt failed, where, and what it cost:
    # the measured failed execution (it said nothing, fresh user's review 7).
    worker = model.tracks[first.track_uuid]
    for engine in ("reader", "trace_processor"):
        (row,) = records(TraceQuery(path, QueryConfig(engine=engine)).task_retries())
        assert (row["task_id"], row["ray_attempts"], row["failed_attempts_seen"]) == (
            "0-1", 2, 1), row
        assert row["error_type"] == "ValueError" and row["lost_ns"] == first.dur
        assert row["failed_worker"] == worker.name


def test_retries_exhausted_every_attempt_once(tmp_path: Path) -> None:
    """The last attempt's measurements come twice (the actor and the error): written once."""
    path = tmp_path / "exhausted.perfetto-trace"
    stage = Stage("explode", _raise_always_on_3, max_retries=1, retry_exceptions=True)
    with pytest.raises(KeyError):
        Pipeline(list(range(N)), [stage]).run(tracing_level=1, trace_path=path, progress=False)
    model = load_complete(path)
    (task,) = tasks_by_id(model)["0-3"]
    assert task.args[L.ARG_STATUS] == L.STATUS_FAILED
    assert task.args[L.ARG_RAY_ATTEMPTS] == 2
    assert task.args[L.ARG_UNMEASURED_ATTEMPTS] == 0
    attempts = executions_by_task(model)["0-3"]
    assert [e.args.get(L.ARG_RAY_ATTEMPT, 0) for e in attempts] == [0, 1]
    assert all(e.args[L.ARG_STATUS] == L.STATUS_FAILED for e in attempts)
    assert len(instants_named(model, L.INSTANT_TASK_FAILED)) == 2


@pytest.mark.parametrize("retry_exceptions", [False, True], ids=["no-actor", "actor"])
def test_timeout_cancels_the_tasks_in_flight(
    tmp_path: Path, markers: str, retry_exceptions: bool
) -> None:
    """Two tasks running (2 CPUs) when the run times out: cancelled, marked on their workers;
    with a metrics actor (a stage that retries exceptions starts one) their partial
    executions are known too."""
    path = tmp_path / "timeout.perfetto-trace"
    slow = functools.partial(_slow_marked, markers)
    stage = Stage("slow", slow, retry_exceptions=retry_exceptions)
    _warm_two_workers(tmp_path / "warm")
    start = time.monotonic()
    with pytest.raises(PipelineTimeoutError, match="2 task"):
        Pipeline(list(range(6)), [stage]).run(
            tracing_level=1, trace_path=path, progress=False, timeout=1.5
        )
    assert time.monotonic() - start < 10  # the cancel is quick, not the 20 s tasks
    # The premise: both had started when the run timed out (a task cancelled before it
    # starts has no worker to be marked on).
    assert sorted(os.listdir(markers)) == ["started-0", "started-1"], "tasks never started"
    model = load_complete(path)
    tasks = tasks_by_id(model)
    assert sorted(tasks) == ["0-0", "0-1"]  # the others were never created
    assert all(t[0].args[L.ARG_STATUS] == L.STATUS_CANCELLED for t in tasks.values())
    assert execution_slice(model).args[L.ARG_ERROR_TYPE] == "PipelineTimeoutError"
    marks = instants_named(model, L.INSTANT_TASK_CANCELLED)
    assert sorted(m.args[L.ARG_TASK_ID] for m in marks) == ["0-0", "0-1"]
    for mark in marks:
        assert str(track_path(model, mark)[1]).startswith(L.NODE_PROCESS_PREFIX)
    executions = executions_by_task(model)
    if retry_exceptions:
        assert sorted(executions) == ["0-0", "0-1"]
        for task_id, (execution,) in executions.items():
            assert execution.args[L.ARG_STATUS] == L.STATUS_CANCELLED
            assert execution.args[L.ARG_ERROR_TYPE] in ("TaskCancelledError", "KeyboardInterrupt")
            # Known as its task's execution: named after its stage, with the stage's arrow.
            assert execution.name == "slow"
            assert [f.dest_id for f in model.flows].count(execution.id) == 1
            # It ran until the cancel: it started before the driver cancelled it (the
            # end of its task slice) and ended after (1 ms of slack between clock reads).
            cancelled_at = tasks[task_id][0].ts + (tasks[task_id][0].dur or 0)
            assert execution.ts < cancelled_at
            assert execution.ts + (execution.dur or 0) >= cancelled_at - 1_000_000
    else:
        assert executions == {}  # Ray's error replaces the one that carried them
    assert_engines_agree(path)


@ray.remote(num_cpus=1)
def _slow_remote(x: int) -> int:
    return _slow(x)


def test_cancel_through_the_tracer_api(tmp_path: Path) -> None:
    """A Daft-style loop cancels three tasks on two CPUs: the third had not started."""
    path = tmp_path / "cancel.perfetto-trace"
    with ray_tracer("cancel-api", level=1, path=path) as tracer:
        refs = {}
        with tracer.dispatch_wave(0):
            for i in range(3):
                tracer.task_created(f"t{i}", 0, ResourceRequest(num_cpus=1), "slow")
            with tracer.dispatching():
                for i in range(3):
                    fn = RayFunctionWrapper.wrap(_slow_remote).with_tracing(tracer, f"t{i}")
                    refs[f"t{i}"] = fn.remote(i)
        started = time.monotonic()
        while len(_running_pids()) < 2 and time.monotonic() - started < 20:
            time.sleep(0.05)
        with tracer.dispatch_wave(1):
            for task_id, ref in refs.items():
                ray.cancel(ref)
                tracer.task_cancelled(task_id)
            tracer.task_cancelled("t0")  # twice, or unknown: nothing happens
            tracer.task_cancelled("nope")
        tracer.stage_done(0)
    for ref in refs.values():
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(ref, timeout=30)
    model = load_complete(path)
    tasks = tasks_by_id(model)
    assert sorted(tasks) == ["t0", "t1", "t2"]
    assert all(t[0].args[L.ARG_STATUS] == L.STATUS_CANCELLED for t in tasks.values())
    marks = instants_named(model, L.INSTANT_TASK_CANCELLED)
    assert len(marks) == 2  # the two running ones, on their workers; the third never ran
    assert len({m.track_uuid for m in marks}) == 2
    # Cancelled tasks release their CPUs at once.
    cpus = [c.value for c in model.counters if model.tracks[c.track_uuid].name
            == L.COUNTER_AVAILABLE_CPUS]
    assert cpus[-1] == 2
    assert_engines_agree(path)


def _running_pids() -> list[int]:
    """Pids of worker processes running ``_slow_remote`` (Ray names them after the task)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"ray::_slow_remote" in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids

"""What a runner of its own gets back from the tracer's failure reports.

``tasks_received_as_ready`` and ``complete_received`` return the tasks that
failed. A runner may iterate over the result or add to it, at any level and
after tracing stopped on an error: the result is always a dict of its own.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import ray

from tracer.ray import RayFunctionWrapper, ResourceRequest, ray_tracer

pytestmark = pytest.mark.usefixtures("ray_local")


@ray.remote
def _ok(x: int) -> int:
    return x


@ray.remote
def _boom(x: int) -> int:
    raise ValueError(f"bad partition {x}")


@ray.remote(num_returns=2)
def _boom_twice(x: int) -> tuple[int, int]:
    raise ValueError(f"bad partition {x}")


def _run(level: int, path: Path, fns: list[object]) -> list[str]:
    """A small runner that collects failures the way a user might: into the report's dict."""
    failed: dict[str, BaseException] = {}
    with ray_tracer(f"reports-{path.stem}", level=level, path=path) as tracer:
        for wave, fn in enumerate(fns):
            with tracer.dispatch_wave(wave):
                task_id = f"0-{wave}"
                tracer.task_created(task_id, 0, ResourceRequest(num_cpus=1), "map")
                ref = RayFunctionWrapper.wrap(fn).with_tracing(tracer, task_id).remote(wave)
                ray.wait([ref], timeout=30)
                failures = tracer.tasks_received_as_ready([task_id])
                failures.update(tracer.complete_received())
                try:
                    ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # its own check, into the same dict
                    failures.setdefault(task_id, exc)
                failed.update(failures)
    return sorted(failed)


@pytest.mark.parametrize("level", [0, 1])
def test_a_runner_that_adds_to_the_reports_does_not_change_later_ones(
    level: int, tmp_path: Path
) -> None:
    """The empty report used to be one shared dict: a runner adding to it made every
    later call, in every execution, report a failure that never happened."""
    assert _run(level, tmp_path / "first.perfetto-trace", [_ok, _boom]) == ["0-1"]
    assert _run(level, tmp_path / "second.perfetto-trace", [_ok, _ok]) == []


def test_reports_stay_dicts_after_tracing_stopped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    out = tmp_path / "traces"
    out.mkdir()
    with ray_tracer("stopped", level=1, path=out / "run.perfetto-trace") as tracer:
        tracer.task_created("0-0", 0, ResourceRequest(num_cpus=1), "map")
        ref = RayFunctionWrapper.wrap(_ok).with_tracing(tracer, "0-0").remote(1)
        shutil.rmtree(out)
        tracer.flush()  # the write fails: tracing stops, the run goes on
        assert tracer.disabled
        assert ray.get(ref) == 1
        received = tracer.tasks_received_as_ready(["0-0"])
        completed = tracer.complete_received()
        assert received == {} and completed == {}
        received["mine"] = ValueError("a runner's own failure")
        assert tracer.complete_received() == {}
    assert any("tracing stopped" in r.getMessage() for r in caplog.records)


def test_a_failure_the_runner_handled_is_not_logged_as_unhandled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed task's measurements return holds its error too: dropped unread, Ray
    logged an "Unhandled error" for a failure the runner had caught and reported."""
    import gc
    import time

    import ray._private.worker as ray_worker

    seen: list[str] = []
    monkeypatch.setattr(ray_worker, "_unhandled_error_handler", lambda e: seen.append(str(e)))
    with ray_tracer("handled", level=1, path=tmp_path / "handled.perfetto-trace") as tracer:
        tracer.task_created("0-0", 0, ResourceRequest(num_cpus=1), "map")
        ref = RayFunctionWrapper.wrap(_boom).with_tracing(tracer, "0-0").remote(7)
        with pytest.raises(ValueError, match="bad partition 7"):
            ray.get(ref)
        tracer.task_failed("0-0", ray.exceptions.RayTaskError("_boom", "", ValueError("x")))
    # The control: a failed task's second return, never read. Ray must report it.
    first, second = _boom_twice.remote(8)
    with pytest.raises(ValueError):
        ray.get(first)
    del ref, first, second
    deadline = time.monotonic() + 20
    while not seen and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.1)
    time.sleep(1.0)  # the traced task's report, had there been one, comes with the control's
    assert len(seen) == 1, seen
    assert "bad partition 8" in seen[0]


@ray.remote
def _nap(x: int) -> int:
    import time

    time.sleep(1.5)  # still running when the tracer closes, right after the dispatch
    return x


def test_a_task_still_running_at_the_close_is_unfinished_not_lost(tmp_path: Path) -> None:
    from tracer.format import read_trace
    from tracer.ray import layout as L

    path = tmp_path / "unfinished.perfetto-trace"
    with ray_tracer("unfinished", level=1, path=path) as tracer:
        tracer.task_created("0-0", 0, ResourceRequest(num_cpus=1), "map")
        ref = RayFunctionWrapper.wrap(_nap).with_tracing(tracer, "0-0").remote(1)
    assert ray.get(ref) == 1  # the run's result, whatever the trace says
    model = read_trace(path, strict=True)
    (task,) = [s for s in model.slices if s.category == L.CAT_TASK and s.depth == 0]
    assert task.args[L.ARG_STATUS] == L.STATUS_UNFINISHED
    (run,) = [s for s in model.slices if s.name == L.SLICE_EXECUTION]
    assert run.args[L.ARG_LOST_MEASUREMENTS] == 0
    assert not [i for i in model.instants if i.name == L.INSTANT_METRICS_LOST]


def test_calls_after_the_close_do_nothing_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """They used to log "tracing stopped ... after an error (TraceWriterClosedError)"."""
    from tracer.format import read_trace

    caplog.set_level(logging.WARNING, logger="tracer")
    path = tmp_path / "closed.perfetto-trace"
    with ray_tracer("closed", level=1, path=path) as tracer:
        pass
    size = path.stat().st_size
    tracer.task_created("0-0", 0, ResourceRequest(num_cpus=1), "map")
    ref = RayFunctionWrapper.wrap(_ok).with_tracing(tracer, "0-0").remote(5)
    assert ray.get(ref) == 5  # submitted as it is, untraced
    assert tracer.tasks_received_as_ready(["0-0"]) == {}
    with tracer.dispatch_wave(1):
        tracer.count_inflight_tasks(0)
    tracer.flush()
    tracer.close()
    assert not tracer.disabled  # it did not stop after an error
    assert [r.getMessage() for r in caplog.records] == []
    assert path.stat().st_size == size
    assert not read_trace(path, strict=True).problems


@ray.remote
def _plus_one(x: int) -> int:
    return x + 1


@pytest.mark.parametrize("order", ["upstream first", "downstream first"])
def test_a_task_whose_input_failed_names_the_failed_task(tmp_path: Path, order: str) -> None:
    """A traced task's measurements do not carry the runner's task id: the downstream
    task's error holds the upstream's, which are found by Ray's task id, whichever
    order the runner reports the two in."""
    from tracer.format import read_trace
    from tracer.ray import layout as L

    path = tmp_path / "upstream.perfetto-trace"
    with ray_tracer("upstream", level=1, path=path) as tracer:
        for task_id, stage in (("0-0", 0), ("1-0", 1)):
            tracer.task_created(task_id, stage, ResourceRequest(num_cpus=1), "map")
        up = RayFunctionWrapper.wrap(_boom).with_tracing(tracer, "0-0").remote(3)
        down = RayFunctionWrapper.wrap(_plus_one).with_tracing(tracer, "1-0").remote(up)
        ray.wait([up, down], num_returns=2, timeout=30)
        ids = ["0-0", "1-0"] if order == "upstream first" else ["1-0", "0-0"]
        failures = tracer.tasks_received_as_ready(ids)
        failures.update(tracer.complete_received())
        for ref in (up, down):  # read, as a runner would: no "unhandled error" later
            with pytest.raises(ValueError, match="bad partition 3"):
                ray.get(ref)
    assert sorted(failures) == ["0-0", "1-0"]
    model = read_trace(path, strict=True)
    tasks = {s.args[L.ARG_TASK_ID]: s for s in model.slices
             if s.category == L.CAT_TASK and s.depth == 0}
    assert tasks["0-0"].args[L.ARG_STATUS] == L.STATUS_FAILED
    assert tasks["1-0"].args[L.ARG_STATUS] == L.STATUS_FAILED_UPSTREAM
    assert tasks["1-0"].args[L.ARG_UPSTREAM_TASK_ID] == "0-0"
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    assert [e.args[L.ARG_TASK_ID] for e in executions] == ["0-0"]  # the downstream never ran

"""Trace paths no run can write: refused at once, with the usual warning, never waited on.

Real Ray, real files: a FIFO (its open blocked forever), a device, and a path
another run (in this process or another) is writing (the second run
overwrote the first's trace).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from trace_checks import execution_slice, load_complete, tasks_by_id

from tracer.format import read_trace
from tracer.ray import RayFunctionWrapper, ResourceRequest, ray_tracer
from tracer.runner import Pipeline, Stage

pytestmark = pytest.mark.usefixtures("ray_local")


def _double(x: int) -> int:
    time.sleep(0.01)
    return x * 2


@ray.remote
def _double_remote(x: int) -> int:
    return x * 2


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records
        if r.name == "tracer" and r.levelno == logging.WARNING
    ]


def _drain_fifo(fifo: Path) -> None:
    """Be the FIFO's reader (what unblocks an open for writing), reading until its writers go."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    os.set_blocking(fd, True)

    def read_all() -> None:
        try:
            while os.read(fd, 1 << 16):
                pass
        finally:
            os.close(fd)

    threading.Thread(target=read_all, daemon=True).start()


def test_a_fifo_as_the_trace_path_is_refused_not_waited_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    outcome: dict[str, Any] = {}

    def run() -> None:
        outcome["results"] = Pipeline(list(range(6)), [Stage("double", _double)]).run(
            tracing_level=1, trace_path=fifo, progress=False
        )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)  # refused: a second or two
    if thread.is_alive():
        _drain_fifo(fifo)  # so that the run ends, and the test with it
        thread.join(60)
        pytest.fail("the run blocked opening the FIFO given as its trace path")
    assert outcome["results"] == [x * 2 for x in range(6)]
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "running untraced" in warnings[0] and str(fifo) in warnings[0]
    assert "FIFO" in warnings[0]


def test_a_device_as_the_trace_path_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    """/dev/null took a run's trace (a "trace" no one can read), until its first bundle
    failed to be written over its tail and tracing stopped mid-run."""
    caplog.set_level(logging.WARNING, logger="tracer")
    with ray_tracer("devnull", level=1, path=os.devnull) as tracer:
        assert not tracer.enabled
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "running untraced" in warnings[0] and "device" in warnings[0]


def test_the_same_path_given_to_two_runs_at_once_the_second_runs_untraced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two dispatch loops of one driver given one path: the second overwrote the first's
    trace. Now the first keeps it, whole, and the second runs untraced, with a warning."""
    caplog.set_level(logging.WARNING, logger="tracer")
    path = tmp_path / "shared.perfetto-trace"
    with ray_tracer("first", level=1, path=path) as first:
        assert first.enabled
        first.task_created("a", 0, ResourceRequest(num_cpus=1), "double")
        with ray_tracer("second", level=1, path=path) as second:
            assert not second.enabled
            second.task_created("b", 0, ResourceRequest(num_cpus=1), "double")
        ref = RayFunctionWrapper.wrap(_double_remote).with_tracing(first, "a").remote(1)
        assert ray.get(ref) == 2
        first.tasks_received_as_ready(["a"])
    model = load_complete(path)
    assert execution_slice(model).args["execution_id"] == "first"
    assert set(tasks_by_id(model)) == {"a"}
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "running untraced" in warnings[0] and "another run is writing it" in warnings[0]
    assert str(path) in warnings[0]


_HOLDER = (
    "import sys\n"
    "from tracer.ray.output import open_trace\n"
    "writer = open_trace(sys.argv[1])\n"
    "print('open', flush=True)\n"
    "sys.stdin.read()\n"
    "writer.close()\n"
)


def test_a_path_another_process_is_writing_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    path = tmp_path / "held.perfetto-trace"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        results = Pipeline(list(range(4)), [Stage("double", _double)]).run(
            tracing_level=1, trace_path=path, progress=False
        )
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(60) == 0
    assert results == [x * 2 for x in range(4)]
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "another run is writing it" in warnings[0], warnings
    model = read_trace(path)  # the other process's trace, whole: no run of ours in it
    assert not model.problems and not model.slices


def test_the_same_path_after_a_run_ended_is_traced_again(tmp_path: Path) -> None:
    """The claim on a path ends with its run's trace: runs one after the other reuse it."""
    path = tmp_path / "again.perfetto-trace"
    for name in ("one", "two"):
        with ray_tracer(name, level=1, path=path) as tracer:
            assert tracer.enabled
            tracer.task_created("a", 0, ResourceRequest(num_cpus=1), "double")
            ref = RayFunctionWrapper.wrap(_double_remote).with_tracing(tracer, "a").remote(1)
            assert ray.get(ref) == 2
            tracer.tasks_received_as_ready(["a"])
    assert execution_slice(load_complete(path)).args["execution_id"] == "two"

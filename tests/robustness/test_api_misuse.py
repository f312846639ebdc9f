"""A runner that misuses the API gets one warning a kind, and a run that still works.

Nested waves and dispatching a task never created were accepted silently (a fresh
user's review): the first drew waves inside waves and lost the outer wave's counts,
the second ran the task untraced with no word of why.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import ray
from trace_checks import executions_by_task, load_complete

from tracer.ray import RayFunctionWrapper, ResourceRequest, ray_tracer
from tracer.ray import layout as L

pytestmark = pytest.mark.usefixtures("ray_local")


@ray.remote(num_cpus=1)
def double(x: int) -> int:
    return 2 * x


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tracer" and r.levelno >= logging.WARNING]


def test_a_task_never_created_runs_untraced_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    path = tmp_path / "uncreated.perfetto-trace"
    with ray_tracer("uncreated", level=1, path=path) as rt, rt.dispatch_wave(0):
        rt.task_created("made", 0, ResourceRequest(num_cpus=1), "double")
        wrapped = RayFunctionWrapper.wrap(double)
        refs = [wrapped.with_tracing(rt, t).remote(i)
                for i, t in enumerate(["made", "ghost-1", "ghost-2"])]
        assert ray.get(refs) == [0, 2, 4]  # the job's results, traced or not
        rt.tasks_received_as_ready(["made"])
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings  # once a tracer, naming the first
    assert "'ghost-1'" in warnings[0] and "task_created" in warnings[0]
    assert set(executions_by_task(load_complete(path))) == {"made"}


def test_a_wave_inside_a_wave_is_warned_of_and_its_counts_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    path = tmp_path / "nested.perfetto-trace"
    wrapped = RayFunctionWrapper.wrap(double)
    with ray_tracer("nested", level=1, path=path) as rt:
        with rt.dispatch_wave(0):
            for wave in (1, 2):
                with rt.dispatch_wave(wave):
                    rt.task_created(f"t{wave}", 0, ResourceRequest(num_cpus=1), "double")
                    ref = wrapped.with_tracing(rt, f"t{wave}").remote(wave)
                    rt.mark_dispatch_task()
                    assert ray.get(ref) == 2 * wave
                    rt.tasks_received_as_ready([f"t{wave}"])
        with rt.dispatch_wave(3):  # a wave after: no more warnings
            pass
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "dispatch_wave(1)" in warnings[0], warnings
    model = load_complete(path)
    waves = {s.args[L.ARG_WAVE]: s for s in model.slices if s.name == L.SLICE_WAVE}
    assert sorted(waves) == [0, 1, 2, 3]
    # Each inner wave counts its own; the outer one all of them (it lost them before).
    assert [waves[w].args.get(L.ARG_TASKS_DISPATCHED) for w in (0, 1, 2)] == [2, 1, 1]

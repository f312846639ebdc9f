"""What a traced task makes its Ray worker import: the task's measurement, not the tracer.

Every worker process that runs a traced task imports the code that measures it
(``tracer.ray.task_metrics``, or ``tracer.integrations.ray_data.worker`` for Ray
Data's map tasks) on its first one. When that pulled in the packages' driver side
(the trace writer and readers, the run timeline, protobuf's generated module) it
cost each worker ~25 ms of CPU (~90 ms where nothing is compiled to .pyc) and
delayed its first task as long. These tests run in fresh workers (a runtime
environment of their own, or a Ray of their own) and fail if the driver's modules
come back.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import ray
from own_driver import HEAVY, heavy, run_driver

from tracer.ray import RayFunctionWrapper, ResourceRequest, ray_tracer

#: The driver's side (the heavy modules, and the tracer's other driver-only ones):
#: none of these is needed to measure a task.
DRIVER_SIDE = (
    *HEAVY,
    "tracer.ray.session",
    "tracer.ray.wrappers",
    "tracer.integrations.ray_data.callback",
    "tracer.integrations.ray_data.execution",
)


def _driver_side(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith(DRIVER_SIDE)]


@pytest.mark.usefixtures("ray_local")
def test_a_traced_task_loads_only_what_measures_it(tmp_path: Path) -> None:
    # A runtime environment no other test uses: Ray starts a worker for it alone.
    fresh = {"env_vars": {"TRACER_TEST_FRESH_WORKER": uuid.uuid4().hex}}

    # Defined here, so that Ray sends it by value: the worker does not import this
    # test module (which imports the driver's side).
    def loaded_tracer_modules() -> list[str]:
        """Which of tracer's modules this worker has loaded."""
        import sys

        return sorted(m for m in sys.modules if m == "tracer" or m.startswith("tracer."))

    body = ray.remote(runtime_env=fresh)(loaded_tracer_modules)
    path = tmp_path / "imports.perfetto-trace"
    with ray_tracer("imports", level=1, path=path) as tracer:
        tracer.task_created("t", 0, ResourceRequest(num_cpus=1), "imports")
        modules = ray.get(RayFunctionWrapper.wrap(body).with_tracing(tracer, "t").remote())
        tracer.tasks_received_as_ready(["t"])
        tracer.stage_done(0)
    assert "tracer.ray.task_metrics" in modules  # it ran measured
    assert _driver_side(modules) == [], modules


def test_ray_datas_worker_side_loads_only_what_measures_it() -> None:
    """What a Ray Data map task's worker imports to be measured (in a process that has
    imported Ray Data, as such a worker has)."""
    code = (
        "import sys, ray.data\n"
        "import tracer.integrations.ray_data.worker\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('tracer')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    modules = proc.stdout.split()
    assert "tracer.ray.task_metrics" in modules
    assert _driver_side(modules) == [], modules


def test_the_public_names_are_all_there() -> None:
    """Loaded on first use, every name the packages export still resolves."""
    import tracer.integrations.ray_data as ray_data
    import tracer.ray

    for package in (tracer.ray, ray_data):
        for name in package.__all__:
            assert getattr(package, name) is not None, (package.__name__, name)
        assert set(package.__all__) <= set(dir(package))
        with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
            package.nothing_here  # noqa: B018


@pytest.mark.usefixtures("ray_local")
def test_a_run_with_tracing_off_loads_none_of_the_tracer() -> None:
    """Tracing off costs nothing: a run at level 0 (tracer's own runner, whose task code
    its workers import) loads neither the writer nor the tracer, in the driver (~25 ms
    of its start-up, ~100 where nothing is compiled to .pyc) or in the workers."""
    code = (
        "import sys, ray\n"
        "from tracer.runner import Pipeline, Stage\n"
        "ray.init()\n"
        "def loaded(_):\n"
        "    import sys\n"
        "    return sorted(m for m in sys.modules if m.startswith('tracer'))\n"
        "(workers,) = Pipeline([0], [Stage('loaded', loaded)]).run(tracing_level=0)\n"
        "print(' '.join(m for m in sys.modules if m.startswith('tracer')))\n"
        "print(' '.join(workers))\n"
    )
    driver, workers = (line.split() for line in run_driver(code)[-2:])
    assert "tracer.runner" in driver
    assert heavy(driver) == [], driver
    assert "tracer.runner.pipeline" in workers  # the runner's own task code
    assert heavy(workers) == [], workers


@pytest.mark.usefixtures("ray_local")
def test_ray_data_with_the_callback_at_level_0_loads_none_of_the_tracer() -> None:
    """Ray Data creates the callback named in ``RAY_DATA_EXECUTION_CALLBACKS`` whatever
    the level: at level 0 it loads the level check, not the writer or the run timeline
    (~65 ms of the driver's imports where nothing is compiled to .pyc)."""
    code = (
        "import sys, ray, ray.data\n"
        "ray.init()\n"
        "assert len(ray.data.range(8).map(lambda r: r).take_all()) == 8\n"
        "print(' '.join(m for m in sys.modules if m.startswith('tracer')))\n"
    )
    lines = run_driver(
        code, RAY_DATA_EXECUTION_CALLBACKS="tracer.integrations.ray_data.TracingCallback"
    )
    driver = lines[-1].split()
    assert "tracer.integrations.ray_data.callback" in driver  # Ray Data made the callback
    assert heavy(driver) == [], driver

"""Ray's task events read from the dashboard head, where Ray sends them instead of the GCS.

With ``RAY_enable_task_events_to_dashboard_head`` (and its aggregator,
``RAY_enable_core_worker_ray_event_to_aggregator``) Ray's workers report
their task events to the dashboard agent, which hands them to the dashboard
head; the GCS then holds none, and ``ray.timeline()`` reads the head (Ray
says it will soon, by default). The tracer reads the head too
(``HeadQuery``): a run there must show Ray's phases as it does elsewhere.
The run is a Ray of its own, in a child process: Ray reads those switches
when it starts, and the dashboard needs ``ray[default]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ray_trace_checks import load

from tracer.ray import layout as L


def _dashboard_installed() -> bool:
    try:  # what Ray itself asks before it starts a dashboard
        import ray.dashboard.optional_deps  # noqa: F401
    except ImportError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not _dashboard_installed(),
    reason="Ray's dashboard is not installed: pip install -e '.[dashboard]' (CI installs it)",
)

_RUN = textwrap.dedent(
    """
    import json, sys
    import ray
    from tracer.ray import ray_events, wait_for_traces
    from tracer.runner import Pipeline, Stage

    def inc(x):
        return x + 1

    ray.init(num_cpus=2, object_store_memory=78643200, include_dashboard=True,
             dashboard_port=int(sys.argv[2]), log_to_driver=False)
    sources = [source.name for source in ray_events._sources()]
    Pipeline(list(range(12)), [Stage("inc", inc)]).run(
        tracing_level=1, trace_path=sys.argv[1], progress=False)
    assert wait_for_traces(timeout=60)
    print(json.dumps(sources))
    """
)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_run_reads_rays_events_from_the_dashboard_head(tmp_path: Path) -> None:
    path = tmp_path / "head.perfetto-trace"
    env = {
        **os.environ,
        "RAY_enable_task_events_to_dashboard_head": "1",
        "RAY_enable_core_worker_ray_event_to_aggregator": "1",
        "TRACER_RAY_EVENTS_BUDGET_S": "10",  # the agent relays them: allow for its start
    }
    out = subprocess.run(
        [sys.executable, "-c", _RUN, str(path), str(_free_port())],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])[0] == "dashboard"  # chosen first
    model = load(path)
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    spans = [s for s in model.slices if (s.name or "").startswith(L.RAY_TASK_PREFIX)]
    assert len(executions) == 12
    assert {s.args[L.ARG_TASK_ID] for s in spans} == {e.args[L.ARG_TASK_ID] for e in executions}
    (read,) = [i for i in model.instants if i.name == L.INSTANT_RAY_EVENTS]
    assert read.args[L.ARG_RAY_EVENTS_MISSING] == 0
    # ... and read from: a failing head would have been replaced by ray.timeline()'s read.
    assert read.args[L.ARG_RAY_EVENTS_SOURCE] == "dashboard"

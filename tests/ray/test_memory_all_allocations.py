"""memray_all_allocations=True: execution slices carry total_allocated, allocation_count."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from tracer.format import read_trace
from tracer.ray import RayFunctionWrapper, ResourceRequest, ray_tracer
from tracer.ray import layout as L

pytestmark = pytest.mark.usefixtures("ray_local")


def _churn(n: int) -> int:
    total = 0
    for _ in range(n):
        total += len(bytearray(100_000))  # allocated and freed: 100 kB each
    return total


@ray.remote
def churn(n: int) -> int:
    return _churn(n)


@pytest.mark.parametrize("all_allocations", [True, False])
def test_totals_reach_the_execution_slice(tmp_path: Path, all_allocations: bool) -> None:
    path = tmp_path / "t.perfetto-trace"
    with ray_tracer(
        "ex", level=2, path=path, memray_all_allocations=all_allocations
    ) as tracer:
        with tracer.dispatch_wave(0):
            tracer.task_created("0-0", 0, ResourceRequest(1, None, 1 << 20), stage_name="churn")
            ref = RayFunctionWrapper.wrap(churn).with_tracing(tracer, "0-0").remote(200)
            ray.wait([ref])
            tracer.tasks_received_as_ready(["0-0"])
        assert ray.get(ref) == 200 * 100_000
    executions = [s for s in read_trace(path).slices if s.category == L.CAT_EXECUTION]
    assert len(executions) == 1
    args = executions[0].args
    if all_allocations:
        assert args[L.ARG_ALLOCATION_COUNT] >= 200
        assert args[L.ARG_TOTAL_ALLOCATED] >= 200 * 100_000
        assert args[L.ARG_HEAP_PEAK] < 2_000_000  # freed each time: a small peak
    else:
        assert L.ARG_TOTAL_ALLOCATED not in args and L.ARG_ALLOCATION_COUNT not in args

"""The return channel's wire form: measurements packed as bytes, and what survives.

A traced task returns its measurements as marshal bytes (Ray passes ``bytes``
through untouched where it pickles a dict; see ``tracer.ray.task_metrics``).
These tests check that nothing is lost on the way: every value a measurement
can hold round-trips, a body that adds what marshal cannot carry still gets
its execution, and bytes that are not ours are never mistaken for measurements.
"""

from __future__ import annotations

import marshal
import time
from pathlib import Path

import pytest
import ray

from tracer.format import read_trace
from tracer.ray import (
    RayFunctionWrapper,
    ResourceRequest,
    collect_ray_task_metrics,
    ray_tracer,
)
from tracer.ray import layout as L
from tracer.ray.task_metrics import pack_metrics, unpack_metrics

SAMPLE = {
    "task_id": "3-17",
    "pid": 4242,
    "node_id": "ab" * 28,
    "ray_task_id": "cd" * 24,
    "assigned_resources": {"CPU": 1.0, "memory": 1048576.0},
    "rss_start": 89_194_496,
    "rss_peak": 6 << 30,
    "start_ns": time.time_ns(),
    "attempt": 2,
    "flag": True,
    "nothing": None,
    "nested": {"list": [1, 2.5, "x"], "tuple": (1, "y")},
    "big": 1 << 70,
    "negative": -12,
}


def test_packed_measurements_are_bytes_and_round_trip_unchanged() -> None:
    packed = pack_metrics(SAMPLE)
    assert isinstance(packed, bytes)
    assert unpack_metrics(packed) == SAMPLE


def test_measurements_marshal_cannot_carry_are_sent_as_the_dict() -> None:
    class Custom:
        pass

    metrics = {**SAMPLE, "custom": Custom()}
    packed = pack_metrics(metrics)
    assert packed is metrics  # Ray pickles it: slower, but nothing is lost
    assert unpack_metrics(packed) is metrics


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"not measurements",
        marshal.dumps(SAMPLE),  # marshal bytes without our mark: someone else's value
        b"TRM1" + marshal.dumps([1, 2, 3]),  # ours, but not a dict
        b"TRM1\xff\x00",  # ours, corrupt
        7,
        None,
    ],
)
def test_values_that_are_not_packed_measurements_are_refused(value: object) -> None:
    assert unpack_metrics(value) is None


def test_truncated_packed_measurements_are_refused() -> None:
    packed = pack_metrics(SAMPLE)
    assert isinstance(packed, bytes)
    for cut in range(len(packed)):
        assert unpack_metrics(packed[:cut]) is None


@ray.remote
def annotated(kind: str) -> str:
    """A traced task whose body adds its own entries to its measurements."""
    with collect_ray_task_metrics("unused", "unused", level=1) as metrics:
        assert metrics is not None  # already measured by the traced call: its dict
        metrics["rows"] = 12
        if kind == "object":
            metrics["custom"] = ray  # a module: marshal cannot carry it, pickle can
        return kind


@pytest.mark.usefixtures("ray_local")
def test_traced_tasks_return_packed_measurements_and_keep_unpackable_ones(
    tmp_path: Path,
) -> None:
    path = tmp_path / "packing.perfetto-trace"
    with ray_tracer("packing", level=1, path=path) as tracer:
        results = {}
        for task_id, kind in [("plain", "plain"), ("object", "object")]:
            tracer.task_created(task_id, 0, ResourceRequest(num_cpus=1), "annotated")
            results[task_id] = ray.get(
                RayFunctionWrapper.wrap(annotated).with_tracing(tracer, task_id).remote(kind)
            )
            tracer.tasks_received_as_ready([task_id])
        tracer.stage_done(0)
    assert results == {"plain": "plain", "object": "object"}
    executions = {
        s.args[L.ARG_TASK_ID]: s
        for s in read_trace(path).slices
        if s.category == L.CAT_EXECUTION
    }
    assert sorted(executions) == ["object", "plain"]
    for execution in executions.values():
        assert execution.args[L.ARG_RAY_TASK_ID]
        assert execution.dur is not None and execution.dur > 0


@pytest.mark.usefixtures("ray_local")
def test_a_traced_task_sends_its_measurements_as_packed_bytes() -> None:
    """What crosses Ray for a plain traced task: the user's arguments in, the packed
    measurements out (not a pickled dict), named by Ray's task id, not the runner's."""
    from tracer.ray.task_metrics import TaskContext
    from tracer.ray.wrappers import _traced_remote

    traced = _traced_remote(annotated, TaskContext("wire", "", None, 1), 1)
    result_ref, measurements_ref = traced.options(num_returns=2).remote("plain")
    result, measurements = ray.get([result_ref, measurements_ref])
    assert result == "plain"
    assert isinstance(measurements, bytes)
    metrics = unpack_metrics(measurements)
    assert metrics is not None
    assert "task_id" not in metrics and metrics["rows"] == 12
    assert metrics["ray_task_id"] == measurements_ref.task_id().hex()
    assert metrics["end_ns"] >= metrics["start_ns"]


@pytest.mark.usefixtures("ray_local")
def test_with_a_metrics_actor_the_task_id_travels_as_the_first_argument() -> None:
    """Failed attempts report through the actor and must name their task: only then
    does a traced call send the runner's task id."""
    from tracer.ray.task_metrics import TaskContext
    from tracer.ray.wrappers import _traced_remote

    ctx = TaskContext("wire-actor", "", None, 1, metrics_actor=True)
    traced = _traced_remote(annotated, ctx, 1)
    result, measurements = ray.get(traced.options(num_returns=2).remote("t-wire", "plain"))
    assert result == "plain"
    metrics = unpack_metrics(measurements)
    assert metrics is not None
    assert metrics["task_id"] == "t-wire" and metrics["rows"] == 12


@ray.remote
def _where_without_core_worker() -> tuple[dict[str, object], dict[str, object], str]:
    """Where this task runs, through the core worker and then with it broken."""
    from tracer.ray import task_metrics

    fast = task_metrics._where()
    proc = task_metrics._PROCESS
    assert proc is not None

    class Broken:
        def __getattr__(self, name: str) -> object:
            raise AttributeError(name)

    core, proc.core = proc.core, Broken()
    try:
        public = task_metrics._where()
    finally:
        proc.core = core
    return fast, public, ray.get_runtime_context().get_task_id()


@pytest.mark.usefixtures("ray_local")
def test_where_a_task_ran_survives_a_core_worker_that_differs() -> None:
    """The core worker is Ray's private API: if it changes, the public one answers."""
    fast, public, task_id = ray.get(_where_without_core_worker.remote())
    assert fast["ray_task_id"] == public["ray_task_id"] == task_id
    assert fast["node_id"] == public["node_id"] == ray.get_runtime_context().get_node_id()
    assert fast["assigned_resources"] == public["assigned_resources"] == {"CPU": 1.0}
    assert "attempt" not in public  # only the core worker knows it

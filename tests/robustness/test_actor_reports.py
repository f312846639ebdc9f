"""Reports of the metrics actor about tasks the runner has already received.

Ray retries a task whose attempt raised (``retry_exceptions``) without telling
the driver; the attempt that raised reports itself through the metrics actor.
That report may reach the driver after the runner received the task (its last
attempt's error): the attempt's execution still belongs to its task (named
after its stage, with the stage's arrow), as it does when the report comes
first. Deterministic: the report is put into the actor before the runner
receives the task, and drained when the task's error is found.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import ray
from trace_checks import executions_by_task, load_complete, tasks_by_id

from tracer.ray import ResourceRequest, ray_tracer
from tracer.ray import layout as L
from tracer.ray.metrics_actor import NAMESPACE, actor_name

pytestmark = pytest.mark.usefixtures("ray_local")


def test_a_failed_attempt_reported_after_the_receipt_keeps_its_stage(tmp_path: Path) -> None:
    path = tmp_path / "late-report.perfetto-trace"
    node_id = ray.get_runtime_context().get_node_id()
    with ray_tracer("late-report", level=1, path=path, metrics_actor=True) as tracer:
        actor = ray.get_actor(actor_name("late-report"), namespace=NAMESPACE)
        with tracer.dispatch_wave(0):
            tracer.task_created("t0", 0, ResourceRequest(num_cpus=1), "flaky")
            tracer.task_dispatched("t0")
            # The task's last return: its last attempt's error (as Ray stores it).
            tracer.register_metrics_ref("t0", ray.put(RuntimeError("second attempt failed")))
            dispatched = time.time_ns()
            time.sleep(0.005)  # the attempt ran after its dispatch
            ray.get(actor.put.remote({
                "task_id": "t0", "attempt": 0, "start_ns": dispatched + 1_000_000,
                "end_ns": dispatched + 3_000_000, "node_id": node_id, "pid": 4321,
                "error_type": "ValueError", "error": "first attempt failed",
            }))
            failures = tracer.tasks_received_as_ready(["t0"])
            failures.update(tracer.complete_received())
        assert set(failures) == {"t0"}
    model = load_complete(path)
    (task,) = tasks_by_id(model)["t0"]
    assert task.args[L.ARG_STATUS] == L.STATUS_FAILED
    (execution,) = executions_by_task(model)["t0"]
    assert execution.args[L.ARG_ERROR_TYPE] == "ValueError"
    assert execution.name == "flaky"  # its stage's, not an anonymous "task"
    assert [f.dest_id for f in model.flows] == [execution.id]

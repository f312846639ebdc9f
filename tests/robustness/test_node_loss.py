"""A node is removed from a running two-node cluster while tasks run on it.

Only the ``ray_cluster`` fixture here (the conftest runs these tests last).
Each test puts the removed node back, so the cluster has two nodes again.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray_starts import started
from trace_checks import (
    execution_slice,
    executions_by_task,
    instants_named,
    load_complete,
    tasks_by_id,
    track_path,
)

from tracer.ray import layout as L
from tracer.runner import Pipeline, Stage

N = 8
OBJECT_STORE_MEMORY = 78643200


def _work(folder: str, x: int) -> int:
    """Leaves start and end markers naming the partition, Ray attempt and node."""
    from ray._private.worker import global_worker

    node = ray.get_runtime_context().get_node_id()
    attempt = global_worker.core_worker.get_current_task_attempt_number()
    tag = f"{x}-{attempt}-{node}"
    Path(folder, f"start-{tag}").touch()
    _until_both_nodes_started(folder)
    for _ in range(10):
        time.sleep(0.05)
    Path(folder, f"end-{tag}").touch()
    return x * 2


def _until_both_nodes_started(folder: str, timeout: float = 30.0) -> None:
    """Hold the task until a task has started on each node.

    Ray does not promise to spread: a worker the owner already leased takes the next
    queued task, so a short task can leave the other node idle for the whole run. A
    task held here keeps its node's only CPU, so the next one must go to the other
    node. The timeout only stops a hang; the test then fails on its own assertion.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len({path.name.rsplit("-", 1)[1] for path in Path(folder).glob("start-*")}) >= 2:
            return
        time.sleep(0.01)


def _markers(folder: Path, kind: str, node: str) -> dict[int, int]:
    """Partition -> Ray attempt of the markers of ``kind`` left on ``node``."""
    found = {}
    for path in folder.glob(f"{kind}-*-{node}"):
        x, attempt, _ = path.name[len(kind) + 1:].split("-")
        found[int(x)] = int(attempt)
    return found


@pytest.fixture
def worker_node(ray_cluster: Any) -> Iterator[Any]:
    """The cluster's non-head node; put back (a new one) after the test."""
    (node,) = ray_cluster.worker_nodes
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    yield node
    if node in ray_cluster.worker_nodes:
        return
    started(lambda: ray_cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_MEMORY),
            "a worker node")
    ray_cluster.wait_for_nodes()
    deadline = time.monotonic() + 30
    while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)


def _run_and_remove(
    cluster: Any, node: Any, folder: Path, path: Path, max_retries: int
) -> dict[str, Any]:
    """Run the pipeline in a thread; remove ``node`` once a task is running there."""
    out: dict[str, Any] = {}
    work = functools.partial(_work, str(folder))
    stages = [Stage("work", work, max_retries=max_retries),
              Stage("inc", abs, max_retries=max_retries)]

    def run() -> None:
        start = time.monotonic()
        try:
            out["results"] = Pipeline(list(range(N)), stages).run(
                tracing_level=1, trace_path=path, progress=False
            )
        except Exception as exc:
            out["error"] = exc
        out["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while (not _markers(folder, "start", node.node_id) and thread.is_alive()
           and time.monotonic() < deadline):
        time.sleep(0.01)
    assert _markers(folder, "start", node.node_id), (
        f"no task ever ran on the worker node (run ended: {not thread.is_alive()}, {out})")
    cluster.remove_node(node)
    thread.join(120)
    assert not thread.is_alive(), "the run hangs after the node was removed"
    return out


def test_node_removed_tasks_retried_elsewhere(
    ray_cluster: Any, worker_node: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "markers"
    folder.mkdir()
    path = tmp_path / "node-lost.perfetto-trace"
    removed = worker_node.node_id
    out = _run_and_remove(ray_cluster, worker_node, folder, path, max_retries=3)
    assert "error" not in out, out
    assert out["results"] == [x * 2 for x in range(N)]

    # Tasks that started on the removed node and never finished there.
    started = _markers(folder, "start", removed)
    finished = _markers(folder, "end", removed)
    interrupted = sorted(set(started) - set(finished))
    assert interrupted

    model = load_complete(path)
    tasks = tasks_by_id(model)
    executions = executions_by_task(model)
    assert sorted(tasks) == sorted(f"{s}-{x}" for s in range(2) for x in range(N))
    assert all(L.ARG_STATUS not in t[0].args for t in tasks.values())  # all succeeded
    for x in interrupted:
        (task,) = tasks[f"0-{x}"]
        assert task.args[L.ARG_RAY_ATTEMPTS] >= 2, task
        assert task.args[L.ARG_UNMEASURED_ATTEMPTS] >= 1, task  # the attempt lost with the node
        (execution,) = executions[f"0-{x}"]  # only the attempt that returned is measured
        assert execution.args[L.ARG_RAY_ATTEMPT] >= 1
        node_name = str(track_path(model, execution)[1])
        assert removed[:8] not in node_name  # it ran again on the surviving node
    # Every other task ran once, and was measured once.
    for task_id, (task,) in tasks.items():
        if task_id.startswith("0-") and int(task_id[2:]) in interrupted:
            continue
        assert L.ARG_RAY_ATTEMPTS not in task.args, task
        assert len(executions[task_id]) == 1
    assert execution_slice(model).args[L.ARG_LOST_MEASUREMENTS] == 0
    assert len(model.flows) == 2 * N


def test_node_removed_without_retries_fails_cleanly(
    ray_cluster: Any, worker_node: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "markers"
    folder.mkdir()
    path = tmp_path / "node-lost-no-retry.perfetto-trace"
    removed = worker_node.node_id
    out = _run_and_remove(ray_cluster, worker_node, folder, path, max_retries=0)
    error = out.get("error")
    assert isinstance(error, ray.exceptions.RayError), out
    interrupted = sorted(set(_markers(folder, "start", removed))
                         - set(_markers(folder, "end", removed)))
    assert interrupted

    model = load_complete(path)
    tasks = tasks_by_id(model)
    failed = {t: s[0] for t, s in tasks.items() if s[0].args.get(L.ARG_STATUS) == L.STATUS_FAILED}
    assert {f"0-{x}" for x in interrupted} <= set(failed), failed
    for x in interrupted:
        assert f"0-{x}" not in executions_by_task(model)  # nothing measured: the node is gone
        assert tasks[f"1-{x}"][0].args[L.ARG_STATUS] == L.STATUS_FAILED_UPSTREAM
    marks = {m.args[L.ARG_TASK_ID] for m in instants_named(model, L.INSTANT_TASK_FAILED)}
    assert {f"0-{x}" for x in interrupted} <= marks
    assert execution_slice(model).args[L.ARG_ERROR_TYPE] == type(error).__name__

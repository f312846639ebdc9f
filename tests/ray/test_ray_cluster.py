"""A traced run on a two-node Ray cluster: executions land on both nodes' tracks."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import ray
from both_nodes import meet
from engines_agree import assert_engines_agree
from ray_trace_checks import check_runner_trace

from tracer.ray import layout as L
from tracer.runner import Pipeline, Stage

NUM_PARTITIONS = 6


def _sleepy(folder: str, x: int) -> int:
    meet(folder, x)  # both nodes run one
    time.sleep(0.05)
    return x + 1


def _where(x: int) -> tuple[int, str]:
    return x, ray.get_runtime_context().get_node_id()


def test_executions_on_both_nodes(ray_cluster: Any, tmp_path: Path) -> None:
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2
    path = tmp_path / "cluster.perfetto-trace"
    folder = tmp_path / "markers"
    folder.mkdir()
    stages = [Stage("sleepy", functools.partial(_sleepy, str(folder))), Stage("where", _where)]
    result = Pipeline(list(range(NUM_PARTITIONS)), stages).run(
        tracing_level=1, trace_path=path, progress=False
    )
    assert [x for x, _ in result] == [i + 1 for i in range(NUM_PARTITIONS)]

    rt = check_runner_trace(path, {"sleepy": NUM_PARTITIONS, "where": NUM_PARTITIONS})
    assert len(rt.nodes) == 2
    assert [n.sibling_order_rank for n in rt.nodes] == [3, 4]  # after scheduler, tasks, stages
    # Node process names carry the start of the Ray node id.
    labels = {n.name.split("(")[1].rstrip(")") for n in rt.nodes if n.name}
    assert {label for label in labels if any(nid.startswith(label) for nid in nodes)} == labels
    # Every node ran tasks of the sleepy stage, each on a worker thread of its own process.
    by_node: dict[str, list[str]] = {}
    for e in rt.executions:
        by_node.setdefault(rt.node_of(e).name or "", []).append(e.name or "")
    assert len(by_node) == 2, by_node
    assert all("sleepy" in names for names in by_node.values()), by_node
    assert all(rt.workers[n.uuid] for n in rt.nodes)
    for workers in rt.workers.values():  # a worker's name is its real pid, once per node
        assert len({t.name for t in workers}) == len(workers)
    # The trace's node for each "where" execution is the node the task reported itself.
    reported = {f"1-{x - 1}": node_id for x, node_id in result}
    for e in rt.executions:
        if e.name == "where":
            assert rt.node_of(e).name.endswith(f"({reported[e.args[L.ARG_TASK_ID]][:8]})")
    cpus = rt.counter_values(L.COUNTER_AVAILABLE_CPUS)
    assert cpus[0] == 2 and cpus[-1] == 2
    assert_engines_agree(path)

"""A Ray Data pipeline on a two-node cluster: executions measured on both nodes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="Ray Data needs pip install -e '.[raydata]'")

import ray
import ray.data
from engines_agree import assert_engines_agree
from ray_data_checks import by_task, check_data_trace, executions, load_data_trace, only_trace

import tracer.integrations.ray_data as traced_data
from tracer.ray import layout as L

BLOCKS = 6


def slow_where(batch: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.2)  # long enough that both nodes' CPUs are busy
    n = len(batch["id"])
    batch["pid"] = [os.getpid()] * n
    batch["node"] = [ray.get_runtime_context().get_node_id()] * n
    return batch


@pytest.fixture
def _traced(ray_cluster: Any, tmp_path: Path) -> Iterator[Path]:
    ray.data.DataContext.get_current().enable_progress_bars = False
    traced_data.enable(level=1, path=tmp_path)
    yield tmp_path
    traced_data.disable()


def test_executions_on_both_nodes_where_they_ran(_traced: Path) -> None:
    for _ in range(3):
        rows = (
            ray.data.range(BLOCKS, override_num_blocks=BLOCKS)
            .map_batches(
                slow_where, ray_remote_args_fn=lambda: {"scheduling_strategy": "SPREAD"}
            )
            .take_all()
        )
        ran = {r["id"]: (r["node"], r["pid"]) for r in rows}
        if len({node for node, _ in ran.values()}) == 2:
            break
        # Ray ran every block on one node (it did once, in a full suite on a loaded
        # machine): this test's subject is a trace of two nodes, so run again.
        for path in _traced.glob("*.perfetto-trace"):
            path.unlink()
    assert len({node for node, _ in ran.values()}) == 2, ran

    model, rt = load_data_trace(only_trace(_traced))
    check_data_trace(rt, {"1: ReadRange": BLOCKS, "2: MapBatches(slow_where)": BLOCKS})
    assert len(rt.nodes) == 2
    nodes_seen = set()
    for e in by_task(executions(model)).values():
        if e.name != "MapBatches(slow_where)":
            continue
        node = rt.node_of(e)
        worker = model.tracks[e.track_uuid].name
        nodes_seen.add(node.name)
        # The worker's pid and its node's id (the track names its first 8 characters).
        assert (node.name, worker) in {
            (n.name, f"{L.WORKER_THREAD_PREFIX} {pid}")
            for nid, pid in ran.values() for n in rt.nodes if nid[:8] in (n.name or "")
        }, (node.name, worker)
    assert len(nodes_seen) == 2
    assert_engines_agree(only_trace(_traced))


def test_a_shuffle_tasks_carry_the_node_they_ran_on(_traced: Path) -> None:
    """A random shuffle's tasks (traced from the driver) say which node each ran on, and
    their executions (from Ray's events) are on those nodes' workers: its fused map's
    rows name the same nodes and workers (Ray Data spreads them)."""
    for _ in range(3):
        rows = (
            ray.data.range(BLOCKS, override_num_blocks=BLOCKS)
            .map_batches(slow_where)
            .random_shuffle()
            .take_all()
        )
        ran_on = {r["node"] for r in rows}
        workers = {(r["node"], r["pid"]) for r in rows}
        if len(ran_on) == 2:
            break
        for path in _traced.glob("*.perfetto-trace"):  # all on one node: again
            path.unlink()
    assert len(ran_on) == 2, ran_on

    model, rt = load_data_trace(only_trace(_traced))
    tasks = rt.task_slices
    maps = [t for t in tasks if t.args[L.ARG_RAY_FUNCTION] == "ShuffleTaskSpec.map"]
    reduces = [t for t in tasks if t.args[L.ARG_RAY_FUNCTION] == "ShuffleTaskSpec.reduce"]
    assert len(maps) == len(reduces) == BLOCKS
    # Each map task ran the fused map of one block: their nodes are the rows' nodes.
    assert {t.args[L.ARG_NODE_ID] for t in maps} == ran_on
    # Their executions are on the very workers the rows name, on the nodes the tasks say.
    execs = by_task(executions(model))
    assert set(execs) == {t.args[L.ARG_TASK_ID] for t in tasks}
    seen = set()
    for t in maps:
        e = execs[t.args[L.ARG_TASK_ID]]
        node = rt.node_of(e).name or ""
        assert t.args[L.ARG_NODE_ID][:8] in node, (t.args, node)
        pid = int((model.tracks[e.track_uuid].name or "").split()[-1])
        seen.add((t.args[L.ARG_NODE_ID], pid))
    assert seen == workers
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert {t.args[L.ARG_NODE_ID] for t in reduces} <= alive

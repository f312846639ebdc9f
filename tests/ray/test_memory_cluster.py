"""Level 2 on a two-node Ray cluster: the memory checks of test_memory_ray, on both nodes.

The same pipeline and the same assertions (called from test_memory_ray), with
the partitions made behind a barrier so that both nodes (1 CPU each) run
tasks: Ray does not promise to spread short tasks. Each node's workers run
their own memray session; each node gets its own memory counters.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest
import test_memory_ray as M
from memory_checks import DecodedCounters, decode_counters
from ray_trace_checks import RunnerTrace, check_runner_trace

from tracer.ray import layout as L
from tracer.runner import Pipeline


def _spread_make(folder: str, index: int) -> bytes:
    """The partition, made once two partitions are being made at once (one per node)."""
    Path(folder, f"started-{index}").touch()
    deadline = time.monotonic() + 30
    while sum(1 for _ in Path(folder).glob("started-*")) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return bytes([65 + index]) * M.SIZE


@pytest.fixture(scope="module")
def run(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("memory-cluster")
    folder = tmp / "markers"
    folder.mkdir()
    path = tmp / "level2.perfetto-trace"
    partitions = [functools.partial(_spread_make, str(folder), i) for i in range(M.PARTITIONS)]
    results = Pipeline(partitions, M.STAGES).run(tracing_level=2, trace_path=path, progress=False)
    return {"path": path, "results": results}


@pytest.fixture(scope="module")
def rt(run: dict[str, Any]) -> RunnerTrace:
    return check_runner_trace(run["path"], {s.name: M.PARTITIONS for s in M.STAGES})


@pytest.fixture(scope="module")
def counters(run: dict[str, Any]) -> DecodedCounters:
    return decode_counters(run["path"])


def test_both_nodes_measured(rt: RunnerTrace) -> None:
    assert len(rt.nodes) == 2
    by_node: dict[str, set[str]] = {}
    for e in rt.executions:
        by_node.setdefault(rt.node_of(e).name or "", set()).add(e.name or "")
    assert len(by_node) == 2 and all("make" in names for names in by_node.values()), by_node


def test_the_single_node_checks_hold(
    run: dict[str, Any], rt: RunnerTrace, counters: DecodedCounters, tmp_path: Path
) -> None:
    M.test_results(run)
    M.test_peaks_follow_the_data(rt)
    M.test_under_requested_tasks_are_flagged(rt)
    M.test_stage_summaries(rt)
    M.test_memory_by_stage_and_the_report_agree(run, rt)
    M.test_worker_heap_and_rss_counters(rt, counters)
    M.test_sizes(rt, counters, tmp_path)


def test_node_counters(rt: RunnerTrace, counters: DecodedCounters) -> None:
    inflate = max(e.args[L.ARG_MEMORY_PEAK] for e in M._executions(rt, "inflate"))
    highest_used = 0
    for node in rt.nodes:
        mine = {counters.names[u]: u for u, p in counters.parents.items() if p == node.uuid}
        requested = counters.samples[mine[L.COUNTER_NODE_MEMORY_REQUESTED]]
        used = counters.samples[mine[L.COUNTER_NODE_MEMORY_USED]]
        assert requested[-1][1] == 0 and used[-1][1] == 0
        # 1 CPU per node: one task at a time on each.
        assert max(v for _, v in requested) <= M.REQUEST
        assert max(v for _, v in used) <= inflate + 1024
        highest_used = max(highest_used, max(v for _, v in used))
        edges = {M._unit(t) for e in rt.executions if rt.node_of(e) is node
                 for t in (e.ts, e.ts + (e.dur or 0))}
        assert {t for t, _ in requested + used} <= edges
    assert highest_used >= inflate - 1024

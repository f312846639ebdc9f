"""``TraceQuery.memory_suggestions`` and ``tracer memory --suggest``: the request each stage
should make, on traces of known memory, and fed back into the mock workload."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import budget_traces as B
import pytest

from tracer.cli import main
from tracer.cli.memory import memory_report
from tracer.query import QueryConfig, TraceQuery, records
from tracer.query.suggest import SUGGESTION_COLUMNS, suggested_request

MIB = B.MIB
GIB = 1024 * MIB
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "big_task_heap_usage.py"

TASKS: list[B.Task] = [
    ("map", 4 * MIB, 16 * MIB), ("map", 4 * MIB, 2 * MIB),
    ("reduce", 64 * MIB, -300 * MIB), ("reduce", 64 * MIB, 10 * MIB),
    ("join", None, None),
    ("free", None, MIB),
]


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return B.write(TASKS, tmp_path_factory.mktemp("suggest") / "known.perfetto-trace")


def suggestions(path: Path, engine: str = "reader", bin_path: str | None = None,
                **kwargs: Any) -> dict[str, dict[str, Any]]:
    config = QueryConfig(engine=engine, trace_processor_path=bin_path)  # type: ignore[arg-type]
    with TraceQuery(path, config) as q:
        frame = q.memory_suggestions(**kwargs)
    assert list(frame.columns) == list(SUGGESTION_COLUMNS)
    assert {c: str(t) for c, t in frame.dtypes.items()} == SUGGESTION_COLUMNS
    return {r["stage"]: r for r in records(frame)}


def test_the_rule(known: Path) -> None:
    rows = suggestions(known)
    assert list(rows) == ["map", "reduce", "join", "free"]
    node = 8 * GIB  # the cluster's memory resource, one node ran the tasks
    assert rows["map"] == {
        "stage_id": 0, "stage": "map", "tasks": 2, "measured": 2, "oom_killed": 0,
        "peak_max_bytes": 16 * MIB, "peak_basis": "heap", "requested_bytes": 4 * MIB,
        "headroom": 1.25, "suggested_bytes": 20 * MIB, "change_bytes": 16 * MIB,
        "change_ratio": 5.0, "node_memory_bytes": node, "tasks_per_node": node // (20 * MIB),
        "tasks_per_node_now": 2048, "note": rows["map"]["note"],
    }
    # A heap peak says what it leaves out: the worker's own memory, which Ray's OOM killer
    # counts (a fresh user's review: 76 MiB suggested where Ray Data said 165.5).
    assert rows["map"]["note"].startswith("the task's heap only")
    assert "OOM killer counts the whole process" in rows["map"]["note"]
    reduce = rows["reduce"]  # the killed task's memory at the kill is its peak, at least
    assert (reduce["peak_max_bytes"], reduce["peak_basis"], reduce["suggested_bytes"]) == (
        300 * MIB, "at kill", 375 * MIB)
    assert (reduce["oom_killed"], reduce["tasks_per_node"], reduce["tasks_per_node_now"]) == (
        1, 21, 128)
    assert "killed by Ray's OOM killer" in reduce["note"] and "lower bound" in reduce["note"]
    join = rows["join"]
    assert join["suggested_bytes"] is None and join["tasks_per_node"] is None
    assert join["note"].startswith("no measured task")
    free = rows["free"]  # 1 MiB x 1.25, up to the next MiB; no request to compare with
    assert (free["suggested_bytes"], free["change_bytes"], free["change_ratio"]) == (
        2 * MIB, 2 * MIB, None)
    assert free["requested_bytes"] is None and free["tasks_per_node_now"] is None
    assert "no request today" in free["note"]


def test_a_task_killed_under_its_request_does_not_count(tmp_path: Path) -> None:
    """Ray kills several workers at once: a task killed using less than its request was
    killed for the others' memory, and that lower bound must not pull its stage's request
    down (a read task killed at 40 MiB beside a map task that blew up had its stage told
    to ask for less than it did). Over its request, it counts."""
    path = B.write([("side", 64 * MIB, -40 * MIB), ("side", 64 * MIB, 10 * MIB),
                    ("blown", 64 * MIB, -90 * MIB), ("blown", 64 * MIB, 10 * MIB)],
                   tmp_path / "collateral.perfetto-trace")
    rows = suggestions(path)
    side = rows["side"]
    assert (side["peak_max_bytes"], side["peak_basis"], side["suggested_bytes"]) == (
        10 * MIB, "heap", 13 * MIB)
    assert side["oom_killed"] == 1 and "under their request" in side["note"]
    blown = rows["blown"]
    assert (blown["peak_max_bytes"], blown["peak_basis"]) == (90 * MIB, "at kill")
    assert "lower bound" in blown["note"]


def test_headroom_node_memory_and_their_errors(known: Path) -> None:
    rows = suggestions(known, headroom=2, node_memory=GIB)
    assert rows["map"]["suggested_bytes"] == 32 * MIB and rows["map"]["headroom"] == 2.0
    assert (rows["map"]["node_memory_bytes"], rows["map"]["tasks_per_node"]) == (GIB, 32)
    rows = suggestions(known, node_memory=300 * MIB)
    assert rows["reduce"]["tasks_per_node"] == 0
    assert "larger than a node's memory" in rows["reduce"]["note"]
    with TraceQuery(known) as q:
        for bad in (0.99, 0, float("nan"), float("inf"), "2", True):
            with pytest.raises(ValueError, match="headroom must be a number >= 1"):
                q.memory_suggestions(headroom=bad)  # type: ignore[arg-type]
        for bad_node in (0, -1, True):
            with pytest.raises(ValueError, match="node_memory must be a positive"):
                q.memory_suggestions(node_memory=bad_node)
    assert suggested_request(0) == MIB  # a request of nothing reserves nothing
    assert suggested_request(MIB) == 2 * MIB and suggested_request(4 * MIB) == 5 * MIB


def test_node_size_is_the_clusters_memory_over_the_nodes_that_ran_tasks(tmp_path: Path) -> None:
    path = B.write([("map", None, MIB)] * 4, tmp_path / "two.perfetto-trace", nodes=2,
                   cluster_memory=6 * GIB)
    (row,) = suggestions(path).values()
    assert (row["node_memory_bytes"], row["tasks_per_node"]) == (3 * GIB, 3 * GIB // (2 * MIB))


def test_level_1_peaks_are_rss(tmp_path: Path) -> None:
    path = B.write([("map", 4 * MIB, 16 * MIB)], tmp_path / "l1.perfetto-trace", level=1)
    (row,) = suggestions(path).values()
    assert row["peak_basis"] == "rss" and row["peak_max_bytes"] == 16 * MIB + B.WORKER_BASELINE
    assert "level-1 peaks are the worker's private RSS" in row["note"]


def test_level_1_uss_peaks_are_said_to_be_uss(tmp_path: Path) -> None:
    """Ray Data's level 1: the peaks are its USS figures, and the suggestion says so, as the
    task table does (it said 'rss')."""
    path = B.write([("map", 4 * MIB, 16 * MIB)], tmp_path / "uss.perfetto-trace", level=1,
                   uss=True)
    (row,) = suggestions(path).values()
    assert row["peak_basis"] == "uss" and row["peak_max_bytes"] == 16 * MIB + B.WORKER_BASELINE
    assert "level-1 peaks are the worker's private RSS (or USS)" in row["note"]
    (task,) = records(TraceQuery(path, QueryConfig(engine="reader")).task_latency())
    assert task["peak_source"] == "uss"


def test_both_engines_suggest_the_same(known: Path, trace_processor_bin: str) -> None:
    ours = suggestions(known)
    theirs = suggestions(known, "trace_processor", trace_processor_bin)
    assert _nan_free(theirs) == _nan_free(ours)


def _nan_free(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        k: {c: (None if isinstance(v, float) and math.isnan(v) else v) for c, v in r.items()}
        for k, r in rows.items()
    }


def test_the_command(known: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(known), "--suggest"]) == 0
    out = capsys.readouterr().out
    assert "Suggested memory request per stage: the largest peak x 1.25, rounded up to a MiB" in out
    assert "a node's memory: 8.0 GiB, the cluster's memory resource over the nodes" in out
    assert "memory= in Ray's .options()" in out and "Stage(memory_bytes=)" in out
    table = out[out.index("Suggested memory request"):]
    map_row = next(line for line in table.splitlines() if line.split()[:2] == ["0", "map"])
    # The suggestion also in bytes, as memory= takes it (20 MiB).
    assert map_row.split()[:16] == [
        "0", "map", "2", "16.0", "MiB", "heap", "4.0", "MiB", "20.0", "MiB", "20971520",
        "+16.0", "MiB", "5.00x", "2048", "409",
    ]
    # Each note once, under the table, and a row names its notes by number (the same
    # long note on every row made each line ~400 columns wide).
    notes = [line for line in table.splitlines() if line.startswith("note ")]
    assert notes and notes[0].startswith("note 1: the task's heap only"), table
    assert len({n.split(": ", 1)[1] for n in notes}) == len(notes)
    assert map_row.split()[16:] == ["1"]
    assert max(len(line) for line in table.splitlines() if not line.startswith(
        ("note ", "per node:", "set it in bytes"))) < 160
    assert out == memory_report(known, suggest=True) + "\n"

    # --headroom and --node-memory imply --suggest; --json adds the rows.
    assert main(["memory", str(known), "--json", "--headroom", "2",
                 "--node-memory", "1 GiB"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_stage = {r["stage"]: r for r in data["suggestions"]}
    assert by_stage["map"]["suggested_bytes"] == 32 * MIB
    assert by_stage["map"]["tasks_per_node"] == 32
    assert main(["memory", str(known), "--json"]) == 0
    assert "suggestions" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--headroom", "0.8"], "argument --headroom: must be a finite number >= 1"),
        (["--headroom", "lots"], "argument --headroom: not a number: 'lots'"),
        (["--node-memory", "64"], "argument --node-memory: node memory '64' is not a size"),
        (["--node-memory", "0 GiB"], "argument --node-memory: must be more than 0 bytes"),
    ],
)
def test_bad_options(known: Path, args: list[str], error: str,
                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["memory", str(known), *args])
    assert info.value.code == 2
    assert error in capsys.readouterr().err


# ------------------------------------------------------------ the mock workload


@pytest.fixture(scope="module")
def example() -> Any:
    """examples/big_task_heap_usage.py as a module whose functions Ray ships by value."""
    from ray import cloudpickle

    spec = importlib.util.spec_from_file_location("big_task_heap_usage", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    yield module
    cloudpickle.unregister_pickle_by_value(module)
    del sys.modules[spec.name]


def test_the_suggestion_fed_back_leaves_no_task_over_its_request(
    ray_local: None, example: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tracer.runner import Pipeline, Stage

    partitions, rows, inflation, deflation = 3, 5000, 16, 8
    partition_bytes = rows * example.ROW_BYTES

    def run(inflate_request: int, path: Path) -> Path:
        # The example's pipeline: each stage asks for twice its input (too little for inflate).
        Pipeline(example.partitions(partitions, rows), [
            Stage("inflate", functools.partial(example.inflate, factor=inflation),
                  memory_bytes=inflate_request),
            Stage("deflate", functools.partial(example.deflate, factor=deflation),
                  memory_bytes=2 * partition_bytes * inflation),
        ]).run(tracing_level=2, trace_path=path, progress=False)
        return path

    first = run(2 * partition_bytes, tmp_path / "as-written.perfetto-trace")
    with TraceQuery(first) as q:
        by_stage = {r["stage"]: r for r in records(q.memory_by_stage())}
        inflate = {r["stage"]: r for r in records(q.memory_suggestions())}["inflate"]
    assert by_stage["inflate"]["over_request"] == partitions  # the under-request, ~8x
    assert by_stage["inflate"]["peak_to_request_max"] > 5
    assert inflate["peak_basis"] == "heap"
    assert inflate["suggested_bytes"] == suggested_request(by_stage["inflate"]["peak_max_bytes"])

    second = run(inflate["suggested_bytes"], tmp_path / "suggested.perfetto-trace")
    assert main(["memory", str(second)]) == 0
    out = capsys.readouterr().out
    assert "Tasks over their memory request, or killed for memory: 0" in out
    assert "(none: every measured task stayed within its request)" in out
    with TraceQuery(second) as q:
        assert [r["over_request"] for r in records(q.memory_by_stage())] == [0, 0]
        assert [r["measured"] for r in records(q.memory_by_stage())] == [partitions] * 2

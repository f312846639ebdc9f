"""The ready-made analyses of the reader engine on traces of known shape.

Every TraceQuery here asks for the reader engine: the default (auto) would
use trace_processor where a binary is found (test_query_engines.py checks
that both engines agree).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import query_workloads as W
from synthetic_trace import BASE, NODE

from tracer.errors import TraceReadError
from tracer.query import SCHEMAS, QueryConfig, TraceQuery, records
from tracer.stats import nearest_rank

MS = 1_000_000
READER = QueryConfig(engine="reader")


def rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return records(frame)


# ------------------------------------------------------------- building blocks


def test_nearest_rank() -> None:
    assert nearest_rank([], 50) is None
    assert nearest_rank([7], 50) == 7
    assert nearest_rank([7], 95) == 7
    values = [5, 1, 4, 2, 3]
    assert nearest_rank(values, 50) == 3  # rank ceil(2.5) = 3
    assert nearest_rank(values, 95) == 5
    assert nearest_rank(range(1, 101), 95) == 95
    assert nearest_rank(range(1, 101), 50) == 50
    assert nearest_rank([10, 20], 50) == 10
    with pytest.raises(ValueError, match="percentile"):
        nearest_rank([1], 0)


def test_config_rejects_an_unknown_engine() -> None:
    with pytest.raises(ValueError, match="engine must be one of"):
        QueryConfig(engine="sqlite")  # type: ignore[arg-type]


@pytest.mark.parametrize("config", [READER, None], ids=["reader", "default"])
def test_missing_and_bad_files(tmp_path: Path, config: QueryConfig | None) -> None:
    with pytest.raises(TraceReadError, match="no such trace file"):
        TraceQuery(tmp_path / "nope.perfetto-trace", config)
    # A folder is read for its newest trace (as the CLI reads it): with none, it says so.
    with pytest.raises(TraceReadError, match="is a folder with no trace in it"):
        TraceQuery(tmp_path, config)
    fifo = tmp_path / "pipe.perfetto-trace"
    os.mkfifo(fifo)
    with pytest.raises(TraceReadError, match="not a file"):
        TraceQuery(fifo, config)
    fifo.unlink()
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    with pytest.raises(TraceReadError, match="not a Perfetto protobuf trace"):
        TraceQuery(text, config)


def test_worker_utilisation_rejects_bad_buckets(synthetic: Path) -> None:
    q = TraceQuery(synthetic, READER)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="buckets"):
            q.worker_utilisation(bad)  # type: ignore[arg-type]


def test_every_analysis_has_its_declared_columns_and_dtypes(synthetic: Path) -> None:
    q = TraceQuery(synthetic, READER)
    for name, schema in SCHEMAS.items():
        frame = getattr(q, name)()
        assert list(frame.columns) == [c for c, _ in schema], name
        for column, kind in schema:
            expected = {"int": "Int64", "float": "float64", "str": "string"}[kind]
            assert str(frame[column].dtype) == expected, (name, column)


# ------------------------------------------------------ synthetic: exact values


def test_synthetic_stage_summary(synthetic: Path) -> None:
    got = rows(TraceQuery(synthetic, READER).stage_summary())
    assert got == [
        {"stage_id": 0, "stage": "map", "tasks": 3, "failed": 0, "wall_ns": 700 - 30,
         "dur_p50_ns": 200, "dur_p95_ns": 200, "dur_max_ns": 200, "memory_requested": 100,
         "peak_p50_bytes": 50, "peak_max_bytes": 250, "over_request": 1},
        # b-0 failed (received at 800), b-1 never received: wall 800 - 500.
        {"stage_id": 1, "stage": "reduce", "tasks": 2, "failed": 1, "wall_ns": 300,
         "dur_p50_ns": 600, "dur_p95_ns": 600, "dur_max_ns": 600, "memory_requested": 0,
         "peak_p50_bytes": None, "peak_max_bytes": None, "over_request": 0},
    ]


def test_synthetic_task_latency(synthetic: Path) -> None:
    got = rows(TraceQuery(synthetic, READER).task_latency())
    phases = ["task_id", "attempt", "status", "worker", "waiting_ns", "scheduling_ns",
              "running_ns", "pickup_ns", "total_ns", "memory_peak"]
    assert [[r[k] for k in phases] for r in got] == [
        ["a-0", 0, "ok", "worker 11", 40, 80, 200, 100, 420, 250],
        # The retried task: the execution at 120 belongs to attempt 0 (created at 45),
        # the one at 400 to attempt 1 (created at 305); attempt 0 was never received.
        ["a-1", 0, "superseded", "worker 12", 30, 45, 80, None, None, None],
        ["a-1", 1, "ok", "worker 12", 5, 90, 200, 100, 395, 50],
        # OOM-killed: no execution; its worker is where its "task failed" mark is.
        ["b-0", 0, "failed", "worker 11", 20, None, None, None, 300, None],
        # Ran on a lane under worker 12 (overlapping its other execution); unfinished.
        ["b-1", 0, "unfinished", "worker 12", 20, 20, 600, None, None, None],
    ]
    assert got[0]["created_ts"] == BASE + 30
    assert {r["node"] for r in got} == {NODE}


def test_synthetic_ray_parts(synthetic: Path) -> None:
    """Scheduling and pickup split at Ray's events, each boundary clamped between its
    neighbours; the parts add up to the phase; NULL where an event is missing."""
    got = rows(TraceQuery(synthetic, READER).task_latency())
    parts = ["sched_queue_ns", "sched_push_ns", "sched_args_ns", "sched_start_ns",
             "pickup_store_ns", "pickup_notify_ns", "pickup_loop_ns"]
    assert [[r["task_id"], r["attempt"], *(r[k] for k in parts)] for r in got] == [
        # dispatched 70, SUBMITTED 100, Ray's span 110-370 (arguments until 130),
        # execution 150-350, FINISHED 380, received 450.
        ["a-0", 0, 30, 10, 20, 20, 20, 10, 70],
        # The execution at 120 takes the span that started at 100, not the one at 390;
        # never received: no pickup parts.
        ["a-1", 0, 15, 10, 5, 15, None, None, None],
        ["a-1", 1, 20, 60, 5, 5, 20, 70, 10],
        ["b-0", 0, None, None, None, None, None, None, None],
        # Ray's span starts at 520, before the dispatch at 530 (clamped), with no
        # arguments phase and no states: nothing to split at.
        ["b-1", 0, None, None, None, None, None, None, None],
    ]
    for r in got:
        if r["sched_queue_ns"] is not None:
            assert sum(r[k] for k in parts[:4]) == r["scheduling_ns"]
        if r["pickup_store_ns"] is not None:
            assert sum(r[k] for k in parts[4:]) == r["pickup_ns"]


def test_synthetic_latency_by_stage(synthetic: Path) -> None:
    got = rows(TraceQuery(synthetic, READER).latency_by_stage())
    assert got[0] == {
        "stage_id": 0, "stage": "map", "tasks": 3,
        "waiting_p50_ns": 30, "waiting_p95_ns": 40, "scheduling_p50_ns": 80,
        "scheduling_p95_ns": 90, "running_p50_ns": 200, "running_p95_ns": 200,
        "pickup_p50_ns": 100, "pickup_p95_ns": 100, "total_p50_ns": 395, "total_p95_ns": 420,
        # Ray's parts (test_synthetic_ray_parts' rows): nearest-rank of 3 values, or 2.
        "sched_queue_p50_ns": 20, "sched_queue_p95_ns": 30,
        "sched_push_p50_ns": 10, "sched_push_p95_ns": 60,
        "sched_args_p50_ns": 5, "sched_args_p95_ns": 20,
        "sched_start_p50_ns": 15, "sched_start_p95_ns": 20,
        "pickup_store_p50_ns": 20, "pickup_store_p95_ns": 20,
        "pickup_notify_p50_ns": 10, "pickup_notify_p95_ns": 70,
        "pickup_loop_p50_ns": 10, "pickup_loop_p95_ns": 70,
    }
    assert all(v is None for k, v in got[1].items() if k.startswith(("sched_", "pickup_")))
    assert got[1]["pickup_p50_ns"] is None  # nothing of stage 1 was received after running
    assert got[1]["total_p95_ns"] == 300


def test_synthetic_dispatch_loop(synthetic: Path) -> None:
    got = rows(TraceQuery(synthetic, READER).dispatch_loop())
    # The execution and the last wave never end: they end at the trace's last event (1200).
    assert [(r["phase"], r["count"], r["total_ns"]) for r in got] == [
        ("plan polling", 3, 30),  # one outside waves, two inside batching
        ("batching", 1, 20),  # 40 minus the 20 of plan polling inside it
        ("dispatching", 1, 20),
        ("awaiting", 2, 750),
        ("no-op task", 1, 20),
        ("gaps in waves", None, 1100 - 830),
        ("gaps between waves", None, 1200 - 1100 - 10),
    ]
    assert sum(r["share"] for r in got) == pytest.approx(1.0)
    assert got[3]["mean_ns"] == 375.0
    assert got[3]["share"] == pytest.approx(750 / 1200)
    assert got[-1]["mean_ns"] is None


def test_synthetic_worker_utilisation(synthetic: Path) -> None:
    got = rows(TraceQuery(synthetic, READER).worker_utilisation(4))
    assert {(r["bucket_ns"], r["node"]) for r in got} == {(300, NODE)}
    busy = {(r["worker"], r["bucket"]): r["busy_ns"] for r in got}
    assert busy == {
        ("worker 11", 0): 150, ("worker 11", 1): 50, ("worker 11", 2): 0, ("worker 11", 3): 200,
        ("worker 12", 0): 80, ("worker 12", 1): 250, ("worker 12", 2): 300, ("worker 12", 3): 250,
    }
    assert [r["start_ns"] for r in got[:4]] == [0, 300, 600, 900]
    assert got[6]["busy_fraction"] == 1.0
    # With Ray's handling: each execution widened to its Ray span (a-0: 110-370 around
    # 150-350; a-1's two attempts: 100-210 and 390-620; b-1: 520-1160), "zzz" (none) as is.
    with_ray = {(r["worker"], r["bucket"]): r["busy_with_ray_ns"] for r in got}
    assert with_ray == {
        ("worker 11", 0): 190, ("worker 11", 1): 70, ("worker 11", 2): 0, ("worker 11", 3): 200,
        ("worker 12", 0): 110, ("worker 12", 1): 290, ("worker 12", 2): 320, ("worker 12", 3): 260,
    }
    assert got[0]["busy_with_ray_fraction"] == pytest.approx(190 / 300)


def test_synthetic_memory(synthetic: Path) -> None:
    q = TraceQuery(synthetic, READER)
    by_stage = rows(q.memory_by_stage())
    assert by_stage[0] == {
        "stage_id": 0, "stage": "map", "tasks": 3, "measured": 2, "requested_bytes": 100,
        "peak_p50_bytes": 50, "peak_max_bytes": 250, "over_request": 1, "no_request": 0,
        "oom_killed": 0, "peak_to_request_max": 2.5,
    }
    assert by_stage[1]["oom_killed"] == 1
    assert by_stage[1]["measured"] == 0
    # The OOM-killed task (b-0, no peak) counts on its node too, as killed.
    assert rows(q.memory_by_node()) == [
        {"node": NODE, "tasks": 2, "peak_p50_bytes": 50, "peak_max_bytes": 250,
         "over_request": 1, "excess_max_bytes": 150, "oom_killed": 1},
    ]
    assert rows(q.memory_flagged()) == [
        {"task_id": "b-0", "attempt": 0, "stage_id": 1, "stage": "reduce", "node": NODE,
         "worker": "worker 11", "reason": "oom killed", "requested_bytes": 0, "peak_bytes": 5000,
         "peak_source": "at kill", "excess_bytes": None, "ratio": None},
        {"task_id": "a-0", "attempt": 0, "stage_id": 0, "stage": "map", "node": NODE,
         "worker": "worker 11", "reason": "over request", "requested_bytes": 100,
         "peak_bytes": 250, "peak_source": "rss", "excess_bytes": 150, "ratio": 2.5},
    ]


def test_synthetic_run_info_and_warnings(synthetic: Path) -> None:
    q = TraceQuery(synthetic, READER)
    assert q.run_info() == {
        "execution_id": "syn", "runner": "synthetic", "tracing_level": 1,
        # the synthetic trace reads no Ray events: it says nothing of them
        "ray_events_source": None, "ray_events_missing": None, "ray_events_dropped": None,
        # nor of the driver's GC (written by hand, not by the run timeline)
        "driver_gc_collections": None, "driver_gc_ns": None, "driver_gc_longest_ns": None,
        # and its run's slice never ended: no error said
        "error_type": None, "error": None, "memory_request_mismatches": None,
        "memray_per_task": None, "memray_per_task_reason": None,
        "lost_measurements": None, "measurements_stopped": None,
    }
    assert q.engine == "reader"
    (warning,) = q.warnings()
    assert "2 unterminated slice" in warning


# ------------------------------------------------------------ real Ray runs


STAGES = ["sleep", "alloc", "boom"]


@pytest.fixture(scope="module")
def level1(level1_trace: Path) -> TraceQuery:
    return TraceQuery(level1_trace, READER)


def test_stage_summary_of_a_real_run(level1: TraceQuery) -> None:
    got = rows(level1.stage_summary())
    assert [(r["stage_id"], r["stage"], r["tasks"]) for r in got] == [
        (0, "sleep", W.PARTITIONS), (1, "alloc", W.PARTITIONS), (2, "boom", W.PARTITIONS)
    ]
    assert [r["failed"] for r in got] == [0, 0, 1]
    sleep, alloc, boom = got
    # Task duration is the execution measured in the worker: the sleep, plus little.
    assert W.SLEEP_S * 1e9 <= sleep["dur_p50_ns"] < W.SLEEP_S * 1e9 + 100 * MS
    assert sleep["dur_p50_ns"] <= sleep["dur_p95_ns"] <= sleep["dur_max_ns"]
    # Two CPUs, six 0.25 s tasks: at least three rounds.
    assert sleep["wall_ns"] >= 3 * W.SLEEP_S * 1e9
    assert [r["memory_requested"] for r in got] == [W.SLEEP_REQUEST, W.ALLOC_REQUEST, 0]
    # Level 1 measures the worker's RSS: far above SLEEP_REQUEST, and the 64 MiB alloc touched.
    assert sleep["over_request"] == W.PARTITIONS
    assert alloc["over_request"] == 0
    assert alloc["peak_max_bytes"] >= W.ALLOC_BYTES
    assert boom["over_request"] == 0  # it asked for nothing: never "over"


def test_task_latency_of_a_real_run(level1: TraceQuery) -> None:
    got = rows(level1.task_latency())
    assert len(got) == 3 * W.PARTITIONS
    assert [r["created_ts"] for r in got] == sorted(r["created_ts"] for r in got)
    failed = [r for r in got if r["status"] == "failed"]
    assert [(r["stage"], r["task_id"]) for r in failed] == [("boom", f"2-{W.BAD_PARTITION}")]
    for r in got:
        assert r["status"] in ("ok", "failed")
        assert r["node"] and r["worker"], r
        for phase in ("waiting_ns", "scheduling_ns", "running_ns", "pickup_ns"):
            assert r[phase] is not None and r[phase] >= 0, (phase, r)
        # The phases cover the task's life exactly.
        assert r["total_ns"] == (
            r["waiting_ns"] + r["scheduling_ns"] + r["running_ns"] + r["pickup_ns"]
        )
        if r["stage"] == "sleep":
            assert r["running_ns"] >= W.SLEEP_S * 1e9


def test_latency_by_stage_of_a_real_run(level1: TraceQuery) -> None:
    got = rows(level1.latency_by_stage())
    assert [r["stage"] for r in got] == STAGES
    sleep = got[0]
    assert W.SLEEP_S * 1e9 <= sleep["running_p50_ns"] < W.SLEEP_S * 1e9 + 100 * MS
    for r in got:
        assert r["tasks"] == W.PARTITIONS
        assert r["total_p50_ns"] >= r["running_p50_ns"]
        for phase in ("waiting", "scheduling", "running", "pickup", "total"):
            assert r[f"{phase}_p50_ns"] <= r[f"{phase}_p95_ns"]


def test_dispatch_loop_of_a_real_run(level1: TraceQuery) -> None:
    got = {r["phase"]: r for r in rows(level1.dispatch_loop())}
    for phase in ("plan polling", "batching", "dispatching", "awaiting"):
        assert got[phase]["count"] > 0
        assert got[phase]["total_ns"] > 0
    assert got["gaps in waves"]["total_ns"] >= 0
    assert got["gaps between waves"]["total_ns"] >= 0
    assert sum(r["share"] for r in got.values()) == pytest.approx(1.0)
    # The loop mostly waits for tasks that sleep.
    assert max(got.values(), key=lambda r: r["share"])["phase"] == "awaiting"
    # Every task was dispatched once: at least one plan poll per task.
    assert got["plan polling"]["count"] >= 3 * W.PARTITIONS


def test_worker_utilisation_of_a_real_run(level1: TraceQuery) -> None:
    util = level1.worker_utilisation(10)
    latency = rows(level1.task_latency())
    workers = {(r["node"], r["worker"]) for r in latency}
    assert len(util) == 10 * len(workers)
    got = rows(util)
    assert {(r["node"], r["worker"]) for r in got} == workers
    assert all(0.0 <= r["busy_fraction"] <= 1.0 for r in got)
    assert len({r["bucket_ns"] for r in got}) == 1
    # Every execution lies inside the run, so the buckets hold all of its time.
    for node, worker in workers:
        busy = sum(r["busy_ns"] for r in got if (r["node"], r["worker"]) == (node, worker))
        ran = sum(r["running_ns"] for r in latency if (r["node"], r["worker"]) == (node, worker))
        assert busy == ran
    # Ray's handling of each task (its arguments, its outputs) around the execution: never
    # less busy, and more in all (the run reads Ray's events, and Ray takes some time).
    assert all(r["busy_with_ray_ns"] >= r["busy_ns"] for r in got)
    assert all(r["busy_with_ray_fraction"] <= 1.0 for r in got)
    assert sum(r["busy_with_ray_ns"] for r in got) > sum(r["busy_ns"] for r in got)


def test_memory_of_a_real_run_at_level_1(level1: TraceQuery) -> None:
    by_stage = rows(level1.memory_by_stage())
    assert [r["over_request"] for r in by_stage] == [W.PARTITIONS, 0, 0]
    assert [r["no_request"] for r in by_stage] == [0, 0, W.PARTITIONS]
    assert [r["measured"] for r in by_stage] == [W.PARTITIONS] * 3
    assert by_stage[1]["peak_max_bytes"] >= W.ALLOC_BYTES
    flagged = rows(level1.memory_flagged())
    assert len(flagged) == W.PARTITIONS
    assert {(r["stage"], r["reason"], r["peak_source"]) for r in flagged} == {
        ("sleep", "over request", "rss")
    }
    assert all(r["excess_bytes"] == r["peak_bytes"] - W.SLEEP_REQUEST for r in flagged)
    excess = [r["excess_bytes"] for r in flagged]
    assert excess == sorted(excess, reverse=True)
    (node,) = rows(level1.memory_by_node())
    assert node["tasks"] == 3 * W.PARTITIONS
    assert node["over_request"] == W.PARTITIONS


def test_memory_of_a_real_run_at_level_2(level2_trace: Path) -> None:
    q = TraceQuery(level2_trace, READER)
    assert q.run_info()["tracing_level"] == 2
    by_stage = rows(q.memory_by_stage())
    # memray's heap peak: the 64 MiB buffer for alloc, next to nothing for sleep.
    assert by_stage[1]["peak_p50_bytes"] >= W.ALLOC_BYTES
    assert by_stage[0]["peak_max_bytes"] < W.SLEEP_REQUEST
    assert [r["over_request"] for r in by_stage] == [0, 0, 0]
    assert rows(q.memory_flagged()) == []
    sources = {r["memory_peak"] is not None for r in rows(q.task_latency())}
    assert sources == {True}


def test_a_truncated_trace_is_analysed_up_to_the_cut(
    truncated_trace: Path, level1: TraceQuery
) -> None:
    q = TraceQuery(truncated_trace, READER)
    warnings = q.warnings()
    assert any("truncated" in w for w in warnings)
    tasks = rows(q.task_latency())
    full = rows(level1.task_latency())
    assert 0 < len(tasks) < len(full)
    assert {(r["task_id"], r["attempt"]) for r in tasks} < {
        (r["task_id"], r["attempt"]) for r in full
    }
    for name in SCHEMAS:
        getattr(q, name)()  # every analysis still answers
    loop = rows(q.dispatch_loop())
    assert sum(r["share"] for r in loop) == pytest.approx(1.0)


def test_ray_parts_of_a_real_run(level1: TraceQuery) -> None:
    """Ray's events split scheduling and pickup of a real run's tasks, part by part."""
    got = rows(level1.task_latency())
    sched = ["sched_queue_ns", "sched_push_ns", "sched_args_ns", "sched_start_ns"]
    pickup = ["pickup_store_ns", "pickup_notify_ns", "pickup_loop_ns"]
    split = [r for r in got if r["sched_queue_ns"] is not None]
    # Ray reports its events about once a second and the close waits for the last ones
    # within a budget: on a loaded machine a few may miss it, never most.
    assert len(split) >= len(got) // 2, got
    for r in split:
        assert all(r[k] is not None and r[k] >= 0 for k in sched + pickup[:1]), r
        assert sum(r[k] for k in sched) == r["scheduling_ns"]
        # Ray can record FINISHED after the runner already had the result (it stores the
        # value first): no state left to split at, notify and loop are empty then.
        if r["pickup_notify_ns"] is not None:
            assert r["pickup_loop_ns"] is not None and r["pickup_loop_ns"] >= 0
            assert sum(r[k] for k in pickup) == r["pickup_ns"]
    assert any(r["pickup_notify_ns"] is not None for r in split)
    by_stage = rows(level1.latency_by_stage())
    assert all(r["pickup_store_p50_ns"] is not None for r in by_stage)

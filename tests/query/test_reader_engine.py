"""The reader engine streams the trace (scan_trace) and keeps rows per task: same answers as
from the whole model, on every kind of trace, and on traces out of order beyond its window."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from tracer.format import TraceWriter, _framing, read_trace
from tracer.query import (
    ANALYSES,
    QueryConfig,
    TraceQuery,
    collect,
    from_model,
    records,
    to_frame,
)
from tracer.query.collect import RAY_EVENTS_INFO, RUN_INFO
from tracer.ray import layout as L

ROOT = Path(__file__).resolve().parents[2]
READER = QueryConfig(engine="reader")


def _simulated_run() -> Any:
    spec = importlib.util.spec_from_file_location(
        "simulated_run", ROOT / "benchmarks" / "simulated_run.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["simulated_run"] = module
    spec.loader.exec_module(module)
    return module


simulated_run = _simulated_run()


def from_whole_model(path: Path, name: str, buckets: int = 7) -> pd.DataFrame:
    """What the reader engine answered before it streamed: from read_trace's model."""
    model = read_trace(path)
    if name == "worker_utilisation":
        return to_frame(from_model.worker_utilisation(model, buckets), name)
    rows: list[dict[str, Any]] = getattr(from_model, name)(model)
    return to_frame(rows, name)


def assert_same_answers(path: Path) -> TraceQuery:
    q = TraceQuery(path, READER)
    for name in ANALYSES:
        got = q.worker_utilisation(7) if name == "worker_utilisation" else getattr(q, name)()
        assert_frame_equal(got, from_whole_model(path, name), check_exact=True, obj=name)
    assert q.run_info() == {
        k: from_model.run_info(read_trace(path)).get(k) for k in (*RUN_INFO, *RAY_EVENTS_INFO)
    }
    return q


MS = 1_000_000
BASE = 1_000_000_000_000


def write_late_trace(path: Path) -> Path:
    """Two tasks on one lane, the first one's ends written after the second's, 2.9 s late
    (tracer's writer is never that late: a trace from elsewhere)."""
    with TraceWriter(path, clock=lambda: BASE) as w:
        root = w.track(f"{L.RUN_TRACK_PREFIX} late", child_ordering="explicit")
        sched = w.track(f"{L.SCHEDULER_PROCESS} (late)", parent=root, rank=0)
        loop = w.track(L.DISPATCH_LOOP_THREAD, parent=sched)
        lane = w.track(L.TASK_LANE, parent=w.track(L.TASKS_TRACK, parent=root, rank=1))
        node = w.track("Node 0 (late)", parent=root, rank=3)
        worker = w.track(f"{L.WORKER_THREAD_PREFIX} 22", parent=node)
        w.begin(loop, L.SLICE_EXECUTION, BASE, category=L.CAT_SCHEDULER,
                args={"execution_id": "late", "runner": "test", "tracing_level": 1})
        for n, (created, start, end) in enumerate(((0, 20, 80), (200, 300, 2900))):
            w.begin(lane, "map", BASE + created * MS, category=L.CAT_TASK,
                    args={L.ARG_TASK_ID: f"t{n}", L.ARG_STAGE_ID: 0, L.ARG_STAGE: "map"})
            w.begin(lane, L.SLICE_DISPATCHED, BASE + (created + 10) * MS, category=L.CAT_TASK)
            w.begin(worker, "map", BASE + start * MS, category=L.CAT_EXECUTION,
                    args={L.ARG_TASK_ID: f"t{n}", L.ARG_MEMORY_PEAK: 1000 + n})
            w.end(worker, BASE + end * MS)
        for received in (3000, 3000, 100, 100):  # t1's ends, then t0's
            w.end(lane, BASE + received * MS)
        w.end(loop, BASE + 3100 * MS)
    return path


@pytest.fixture(scope="module")
def run_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reader") / "run.perfetto-trace"
    return simulated_run.write_run(path, 3000, stages=3, nodes=2, workers_per_node=3)


def test_streamed_answers_are_the_whole_models(
    synthetic: Path, run_trace: Path, level1_trace: Path
) -> None:
    for path in (synthetic, run_trace, level1_trace):
        assert_same_answers(path)
    summary = TraceQuery(run_trace, READER).stage_summary()
    assert list(summary["tasks"]) == [1000, 1000, 1000]


def test_a_trace_out_of_order_beyond_the_window_is_scanned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ends 2.9 s late (past the 2 s window), read in small chunks so that events are
    matched as they come: the second scan's window holds them; answers unchanged."""
    path = write_late_trace(tmp_path / "late.perfetto-trace")
    model = read_trace(path)
    assert [(s.name, s.ts - BASE, s.dur) for s in model.slices if s.category == L.CAT_TASK] == [
        ("map", 0, 100 * MS), ("dispatched", 10 * MS, 90 * MS),
        ("map", 200 * MS, 2800 * MS), ("dispatched", 210 * MS, 2790 * MS),
    ]
    monkeypatch.setattr(_framing, "CHUNK_SIZE", 8)
    windows: list[int | None] = []
    scan = collect.scan_trace

    def recorded(*args: Any, window_ns: int | None, **kwargs: Any) -> Any:
        windows.append(window_ns)
        return scan(*args, window_ns=window_ns, **kwargs)

    monkeypatch.setattr(collect, "scan_trace", recorded)
    q = assert_same_answers(path)
    assert windows[0] == 2_000_000_000 and len(windows) == 2 and windows[1] >= 2_900 * MS
    assert list(q.task_latency()["total_ns"]) == [100 * MS, 2800 * MS]


def test_an_execution_is_a_slice_of_a_worker_track_in_both_engines(tmp_path: Path) -> None:
    """Executions on a worker's track (a child of a node's, "Node ...") or on a lane
    under it count, with the node's and worker's names; ones deeper, on the node itself,
    on a thread or elsewhere do not, in trace_processor's SQL as in the reader."""
    from tracer.query import TraceProcessorNotFoundError, find_trace_processor

    path = tmp_path / "tracks.perfetto-trace"
    with TraceWriter(path, clock=lambda: BASE) as w:
        node = w.track("Node X")
        worker = w.track("worker 70", parent=node)
        lane = w.track("lane", parent=worker)
        w.process_track(8, "Node Y")
        tracks = [worker, lane, w.track("lane", parent=lane), node,
                  w.thread_track(8, 80, "worker 80"), w.track("global")]
        tasks = w.track(L.TASKS_TRACK)
        for i, track in enumerate(tracks):
            task_lane = w.track(L.TASK_LANE, parent=tasks)
            w.begin(task_lane, "map", BASE + i, category=L.CAT_TASK,
                    args={L.ARG_TASK_ID: str(i), L.ARG_STAGE_ID: 0})
            w.begin(track, "map", BASE + 10 + i * 10, category=L.CAT_EXECUTION,
                    args={L.ARG_TASK_ID: str(i)})
            w.end(track, BASE + 15 + i * 10)
            w.end(task_lane, BASE + 100 + i)
    reader = TraceQuery(path, READER).task_latency()
    got = records(reader)
    assert [r["worker"] for r in got] == ["worker 70"] * 2 + [None] * 4
    assert [r["node"] for r in got] == ["Node X"] * 2 + [None] * 4
    assert [r["running_ns"] for r in got] == [5, 5, None, None, None, None]
    try:
        binary = find_trace_processor()
    except TraceProcessorNotFoundError:
        pytest.skip("no trace_processor binary: the reader's side was checked")
    with TraceQuery(path, QueryConfig(engine="trace_processor", trace_processor_path=binary)) as tp:
        assert_frame_equal(tp.task_latency(), reader, check_exact=True)
        assert_frame_equal(tp.worker_utilisation(3), TraceQuery(path, READER).worker_utilisation(3))


def test_a_task_the_cut_left_open_is_unfinished_in_both_engines(tmp_path: Path) -> None:
    """A task in flight where a crash cut the trace (its slice never ends) is
    'unfinished', never 'ok'; a task received with its result is 'ok' in the tracer_task
    table as in task_latency."""
    from tracer.query import find_trace_processor

    path = tmp_path / "cut.perfetto-trace"
    with TraceWriter(path, clock=lambda: BASE) as w:
        tasks = w.track(L.TASKS_TRACK)
        lanes = [w.track(L.TASK_LANE, parent=tasks) for _ in range(3)]
        for i, lane in enumerate(lanes):
            w.begin(lane, "map", BASE + i, category=L.CAT_TASK,
                    args={L.ARG_TASK_ID: str(i), L.ARG_STAGE_ID: 0})
        w.end(lanes[0], BASE + 50)
        w.end(lanes[1], BASE + 60, args={L.ARG_STATUS: L.STATUS_FAILED})
        # lanes[2]'s task never ends: the run died with it in flight.
    expected = [("0", "ok", 50), ("1", "failed", 59), ("2", "unfinished", None)]
    reader = TraceQuery(path, READER).task_latency()
    assert [(r["task_id"], r["status"], r["total_ns"]) for r in records(reader)] == expected
    assert list(TraceQuery(path, READER).stage_summary()["failed"]) == [1]
    with TraceQuery(path, QueryConfig(engine="trace_processor",
                                      trace_processor_path=find_trace_processor())) as tp:
        assert_frame_equal(tp.task_latency(), reader, check_exact=True)
        raw = tp.query("SELECT task_id, status FROM tracer_task ORDER BY task_id")
        assert [tuple(r) for r in raw.itertuples(index=False)] == [
            (task_id, status) for task_id, status, _ in expected]

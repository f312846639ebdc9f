"""Requested vs actual memory on a real Ray, measured by real memray (tracing level 2).

A pipeline of plans whose memory is known from their data: the partition is
made inside the first task; "identity" returns its input; "inflate" repeats
it INFLATION times; "deflate" keeps 1/DEFLATION of it; "batched map"
transforms it batch by batch and joins the batches. Each execution's heap
peak (memray) must relate to its input as the plan says, the under-requested
stages must be flagged, and the counters and sizes must hold.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import ray
from memory_checks import DecodedCounters, decode_counters
from ray_trace_checks import RunnerTrace, check_runner_trace

from tracer.cli._output import Style, fmt_bytes
from tracer.cli.memory import memory_report
from tracer.format import Slice, TraceWriter
from tracer.query import TraceQuery, records
from tracer.ray import collect_ray_task_metrics
from tracer.ray import layout as L
from tracer.ray.timeline.memory import TIME_UNIT_NS
from tracer.runner import Pipeline, Stage
from tracer.stats import nearest_rank

pytestmark = pytest.mark.usefixtures("ray_local")

MIB = 1 << 20
SIZE = 4 * MIB  # each partition
PARTITIONS = 4
INFLATION = 4
DEFLATION = 8
BATCH = 256 * 1024
REQUEST = 8 * MIB

MEMORY_ARGS = {
    L.ARG_MEMORY_REQUESTED, L.ARG_MEMORY_PEAK, L.ARG_OVER_REQUEST, L.ARG_HEAP_PEAK,
    L.ARG_ALLOCATIONS, L.ARG_HEAP_RETAINED, L.ARG_RSS_PEAK, L.ARG_MEMRAY, L.ARG_MEMRAY_REASON,
}


def _make(index: int) -> Any:
    return lambda: bytes([65 + index]) * SIZE


def _identity(data: bytes) -> bytes:
    return data


def _inflate(data: bytes) -> bytes:
    out = data * INFLATION
    time.sleep(0.05)  # held across a few of memray's 10 ms snapshots
    return out


def _deflate(data: bytes) -> bytes:
    return data[: len(data) // DEFLATION]


def _batched_map(data: bytes) -> bytes:
    batches = [data[i : i + BATCH].lower() for i in range(0, len(data), BATCH)]
    return b"".join(batches)


STAGES = [
    Stage("make", _identity, memory_bytes=REQUEST),
    Stage("identity", _identity, memory_bytes=REQUEST),
    Stage("inflate", _inflate, memory_bytes=REQUEST),
    Stage("deflate", _deflate),  # no request: never "over"
    Stage("batched map", _batched_map, memory_bytes=MIB),
]
#: Input size of each stage's tasks.
INPUT = {
    "make": SIZE,
    "identity": SIZE,
    "inflate": SIZE,
    "deflate": SIZE * INFLATION,
    "batched map": SIZE * INFLATION // DEFLATION,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("memory") / "level2.perfetto-trace"
    pipeline = Pipeline([_make(i) for i in range(PARTITIONS)], STAGES)
    results = pipeline.run(tracing_level=2, trace_path=path, progress=False)
    return {"path": path, "results": results}


@pytest.fixture(scope="module")
def rt(run: dict[str, Any]) -> RunnerTrace:
    return check_runner_trace(run["path"], {s.name: PARTITIONS for s in STAGES})


@pytest.fixture(scope="module")
def counters(run: dict[str, Any]) -> DecodedCounters:
    return decode_counters(run["path"])


def _unit(ts: int) -> int:
    """``ts`` as the memory counters write it."""
    return ts // TIME_UNIT_NS * TIME_UNIT_NS


def _executions(rt: RunnerTrace, stage: str) -> list[Slice]:
    found = [s for s in rt.executions if s.name == stage]
    assert len(found) == PARTITIONS, (stage, found)
    return found


def test_results(run: dict[str, Any]) -> None:
    expected = [bytes([97 + i]) * (SIZE * INFLATION // DEFLATION) for i in range(PARTITIONS)]
    assert run["results"] == expected


def test_peaks_follow_the_data(rt: RunnerTrace) -> None:
    for e in rt.executions:
        assert L.ARG_MEMRAY not in e.args, e.args  # one task at a time per worker: all measured
        assert e.args[L.ARG_MEMORY_PEAK] == e.args[L.ARG_HEAP_PEAK]
        assert e.args[L.ARG_RSS_PEAK] > 0 and e.args[L.ARG_ALLOCATIONS] >= 0
    peak = {name: [e.args[L.ARG_HEAP_PEAK] for e in _executions(rt, name)] for name in INPUT}
    # The interpreter's and Ray's own allocations (other threads) during a task: Ray's
    # threads allocate up to 1 MiB at once (a CI run saw a make task at 4 MiB + 1 MiB
    # + 33 bytes: one such block, and the task's own few bytes).
    slack = MIB + 64 * 1024
    # Making the partition allocates it once.
    assert all(SIZE <= p <= SIZE + slack for p in peak["make"]), peak["make"]
    # The input is deserialised before the task body runs: identity allocates ~nothing.
    assert all(p < SIZE // 4 for p in peak["identity"]), peak["identity"]
    # Inflating by N: a peak of about N times the input.
    assert all(
        INFLATION * SIZE <= p <= INFLATION * SIZE + slack for p in peak["inflate"]
    ), peak["inflate"]
    # Deflating: only the smaller output, far below the input.
    deflated = INPUT["deflate"] // DEFLATION
    assert all(deflated <= p <= deflated + slack for p in peak["deflate"]), peak["deflate"]
    assert max(peak["deflate"]) < INPUT["deflate"] // 4
    # Batched: the batches plus the joined output, about twice the input.
    size = INPUT["batched map"]
    assert all(size <= p <= 2 * size + slack for p in peak["batched map"]), peak["batched map"]


def test_under_requested_tasks_are_flagged(rt: RunnerTrace) -> None:
    over = {"inflate", "batched map"}
    for e in rt.executions:
        requested = e.args[L.ARG_MEMORY_REQUESTED]
        assert requested == next(s.memory_bytes or 0 for s in STAGES if s.name == e.name)
        if e.name in over:
            assert e.args[L.ARG_OVER_REQUEST] is True, e.args
        else:
            assert L.ARG_OVER_REQUEST not in e.args, e.args
    # No request at all: not flagged, but a query on memory_requested = 0 finds them.
    unrequested = {e.name for e in rt.executions if e.args[L.ARG_MEMORY_REQUESTED] == 0}
    assert unrequested == {"deflate"}


def test_stage_summaries(rt: RunnerTrace) -> None:
    for track in rt.stage_tracks:
        (stage,) = rt.on(track)
        peaks = sorted(e.args[L.ARG_MEMORY_PEAK] for e in _executions(rt, stage.name or ""))
        assert stage.args[L.ARG_MEMORY_PEAK] == {
            "min": peaks[0], "p50": nearest_rank(peaks, 50), "max": peaks[-1]
        }
        request = next(s.memory_bytes or 0 for s in STAGES if s.name == stage.name)
        summary = dict.fromkeys(("min", "p50", "max"), request)
        assert stage.args[L.ARG_MEMORY_REQUESTED] == summary
        over = PARTITIONS if stage.name in ("inflate", "batched map") else 0
        assert stage.args[L.ARG_TASKS_OVER_REQUEST] == over



PLAIN = Style(rich=False, color=False)


def test_memory_by_stage_and_the_report_agree(run: dict[str, Any], rt: RunnerTrace) -> None:
    """The query layer's per-stage memory, and the text report scripts print (the CLI's)."""
    with TraceQuery(run["path"]) as q:
        rows = {r["stage"]: r for r in records(q.memory_by_stage())}
    assert list(rows) == [s.name for s in STAGES]
    assert rows["inflate"]["over_request"] == PARTITIONS
    assert rows["deflate"]["no_request"] == PARTITIONS
    for name, row in rows.items():
        peaks = sorted(e.args[L.ARG_MEMORY_PEAK] for e in _executions(rt, name))
        assert row["tasks"] == row["measured"] == PARTITIONS
        assert row["peak_max_bytes"] == peaks[-1]
        assert row["peak_p50_bytes"] == peaks[(len(peaks) + 1) // 2 - 1]  # nearest rank
    text = memory_report(run["path"])
    assert "memray's heap peak" in text
    table = text.split("Requested vs actual, by stage")[1].split("By node")[0]
    for name, row in rows.items():
        line = next(line for line in table.splitlines() if f" {name} " in f" {line} ")
        assert fmt_bytes(row["peak_max_bytes"], PLAIN) in line, line
    flagged = text.split("Tasks over their memory request")[1]
    assert flagged.count("inflate") == PARTITIONS


def test_worker_heap_and_rss_counters(rt: RunnerTrace, counters: DecodedCounters) -> None:
    by_parent: dict[int, dict[str, int]] = {}
    for uuid, name in counters.names.items():
        by_parent.setdefault(counters.parents[uuid], {})[name] = uuid
    workers = [w for threads in rt.workers.values() for w in threads]
    assert workers
    inflate_peak = max(e.args[L.ARG_HEAP_PEAK] for e in _executions(rt, "inflate"))
    highest = 0
    for worker in workers:
        mine = by_parent[worker.uuid]
        assert set(mine) == {L.COUNTER_WORKER_HEAP, L.COUNTER_WORKER_RSS}
        heap = counters.samples[mine[L.COUNTER_WORKER_HEAP]]
        rss = counters.samples[mine[L.COUNTER_WORKER_RSS]]
        runs = [s for s in rt.on(worker) if s.category == L.CAT_EXECUTION]
        first, last = min(s.ts for s in runs), max(s.ts + (s.dur or 0) for s in runs)
        for ts, value in heap + rss:  # times are rounded down to TIME_UNIT_NS
            assert first - TIME_UNIT_NS < ts <= last and value >= 0
        # Between tasks nothing is tracked: the heap is back to 0 at every task's end.
        assert heap[-1][1] == 0
        ends = {_unit(s.ts + (s.dur or 0)) for s in runs}
        last_at = dict(heap)  # per time, the last sample written (trace_processor keeps order)
        assert all(v == 0 for ts, v in last_at.items() if ts in ends), (ends, heap)
        highest = max(highest, max(v for _, v in heap))
        # Counters are sorted per worker sequence: no sample with an absolute timestamp.
        assert [t for t, _ in heap] == sorted(t for t, _ in heap)
        # tracer's reader agrees with perfetto's pb2 (extra counter values included).
        for name, samples in ((L.COUNTER_WORKER_HEAP, heap), (L.COUNTER_WORKER_RSS, rss)):
            read = sorted((c.ts, c.value) for c in rt.model.counters_on(mine[name]))
            assert read == sorted(samples), name
    # Inflate holds its output across snapshots: the heap counter shows it (KiB rounding).
    assert INFLATION * SIZE - 2048 <= highest <= inflate_peak + 2048


def test_every_task_s_heap_peak_is_on_its_worker_s_counter(
    rt: RunnerTrace, counters: DecodedCounters
) -> None:
    """Most of these tasks take less than memray's 10 ms between snapshots, so no
    snapshot shows their peak: the counter still reaches it, inside the execution."""
    heap_of = {
        counters.parents[uuid]: samples for uuid, samples in counters.samples.items()
        if counters.names[uuid] == L.COUNTER_WORKER_HEAP
    }
    for worker in (w for threads in rt.workers.values() for w in threads):
        for e in (s for s in rt.on(worker) if s.category == L.CAT_EXECUTION):
            end = e.ts + (e.dur or 0)
            inside = [v for ts, v in heap_of[worker.uuid] if _unit(e.ts) <= ts <= end]
            # (KiB rounding: the counter's values are whole KiB.)
            assert max(inside, default=0) >= e.args[L.ARG_HEAP_PEAK] - 512, (e.name, e.args)


def test_node_counters(rt: RunnerTrace, counters: DecodedCounters) -> None:
    (node,) = rt.nodes
    mine = {counters.names[u]: u for u, p in counters.parents.items() if p == node.uuid}
    requested = counters.samples[mine[L.COUNTER_NODE_MEMORY_REQUESTED]]
    used = counters.samples[mine[L.COUNTER_NODE_MEMORY_USED]]
    assert requested[-1][1] == 0 and used[-1][1] == 0
    assert [t for t, _ in requested] == sorted(t for t, _ in requested)
    assert [t for t, _ in used] == sorted(t for t, _ in used)
    # 2 CPUs: at most two tasks at once.
    assert REQUEST in {v for _, v in requested} and max(v for _, v in requested) <= 2 * REQUEST
    inflate = max(e.args[L.ARG_MEMORY_PEAK] for e in _executions(rt, "inflate"))
    assert inflate - 1024 <= max(v for _, v in used) <= 2 * inflate + 1024
    for uuid, samples in ((mine[L.COUNTER_NODE_MEMORY_REQUESTED], requested),
                          (mine[L.COUNTER_NODE_MEMORY_USED], used)):
        assert sorted((c.ts, c.value) for c in rt.model.counters_on(uuid)) == sorted(samples)
    # Every step is an execution's start or end.
    edges = {_unit(t) for e in rt.executions for t in (e.ts, e.ts + (e.dur or 0))}
    assert {t for t, _ in requested + used} <= edges


def test_sizes(rt: RunnerTrace, counters: DecodedCounters, tmp_path: Path) -> None:
    # Memory counters: ~9 bytes per value when a packet carries both tracks of a
    # pair (17.4 measured), ~15 when it carries one (15.5), each kind checked on its own.
    # (Their mix follows the run, how often heap and RSS change together, not the
    # encoding: on average 11.3-11.9 bytes a value, 12.1 once on a loaded machine.)
    memory_sequences = [sid for sid in counters.packet_sizes if sid != 1]
    by_kind: dict[int, list[int]] = {}
    for sid in memory_sequences:
        for size, n in zip(counters.packet_sizes[sid], counters.packet_values[sid], strict=True):
            by_kind.setdefault(n, []).append(size)
    assert set(by_kind) == {1, 2}, by_kind.keys()
    assert sum(by_kind[2]) / len(by_kind[2]) <= 19, by_kind[2]  # 9.5 bytes a value
    assert sum(by_kind[1]) / len(by_kind[1]) <= 16.5, by_kind[1]
    assert max(size for sid in memory_sequences for size in counters.packet_sizes[sid]) <= 21
    costs = [_annotation_bytes({k: v for k, v in e.args.items() if k in MEMORY_ARGS}, tmp_path)
             for e in rt.executions]
    assert max(costs) <= 200, max(costs)


def _annotation_bytes(args: dict[str, Any], tmp_path: Path) -> int:
    """What ``args`` add to a slice once their names are interned."""
    w = TraceWriter(tmp_path / "size.pftrace", clock=lambda: 1)
    track = w.track("t")
    w.complete(track, "n", 1, 2, args=args)  # interns the names
    n0 = len(w._buf)
    w.complete(track, "n", 3, 4, args=args)
    n1 = len(w._buf)
    w.complete(track, "n", 5, 6)
    n2 = len(w._buf)
    w.close()
    return (n1 - n0) - (n2 - n1)


def test_level_one_memory_is_never_blank(tmp_path: Path) -> None:
    path = tmp_path / "level1.perfetto-trace"
    Pipeline([_make(i) for i in range(2)], STAGES[:3]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    rt = check_runner_trace(path, {s.name: 2 for s in STAGES[:3]})
    for e in rt.executions:
        assert e.args[L.ARG_MEMORY_PEAK] > 0 and L.ARG_HEAP_PEAK not in e.args
    counters = decode_counters(path)
    names = set(counters.names.values())
    assert L.COUNTER_WORKER_RSS in names and L.COUNTER_WORKER_HEAP not in names
    assert {L.COUNTER_NODE_MEMORY_REQUESTED, L.COUNTER_NODE_MEMORY_USED} <= names


@ray.remote(max_concurrency=3)
class _Threaded:
    """A threaded actor: its calls run concurrently in one worker process."""

    def work(self, task_id: str, hold: float) -> dict[str, Any]:
        with collect_ray_task_metrics("threads", task_id, 0, level=2) as metrics:
            time.sleep(hold)
            block = bytearray(4 * MIB)
            time.sleep(0.05)
            del block
        assert metrics is not None
        return metrics


def test_threaded_actor_degrades_to_level_one() -> None:
    actor = _Threaded.remote()  # type: ignore[attr-defined]
    results = ray.get([actor.work.remote(f"t{i}", 0.3) for i in range(3)], timeout=60)
    statuses = sorted(m.get("memray", "ok") for m in results)
    assert statuses == ["shared", "unavailable", "unavailable"], statuses
    assert len({m["pid"] for m in results}) == 1
    for m in results:
        assert m["rss_peak"] > 0 and m["end_ns"] > m["start_ns"]
    alone = ray.get(actor.work.remote("alone", 0.0), timeout=60)
    assert "memray" not in alone and alone["heap_peak"] >= 4 * MIB
    ray.kill(actor)

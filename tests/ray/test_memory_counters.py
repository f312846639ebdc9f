"""Memory counters without Ray: CounterSequence bytes, MemoryTrace watermarks, the report."""

from __future__ import annotations

from pathlib import Path

import pytest
from memory_checks import decode_counters

from tracer.errors import UnknownTrackError
from tracer.format import TraceWriter, read_trace
from tracer.format.writer import CounterTrack
from tracer.ray import layout as L
from tracer.ray.memory import downsample, peak_time, put_figures
from tracer.ray.timeline.memory import MemoryTrace, kib

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
MIB = 1 << 20


def _writer(path: Path) -> TraceWriter:
    return TraceWriter(path, clock=lambda: T0)


def _pair(w: TraceWriter) -> tuple[CounterTrack, CounterTrack]:
    w.process_track(7, "node")
    thread = w.thread_track(7, 8, "worker")
    heap = w.counter_track("heap", parent=thread, unit="bytes", unit_multiplier=1024)
    rss = w.counter_track("RSS", parent=thread, unit="bytes", unit_multiplier=1024)
    return heap, rss


def test_counter_sequence_decodes_with_perfetto_pb2(tmp_path: Path) -> None:
    path = tmp_path / "c.pftrace"
    w = _writer(path)
    heap, rss = _pair(w)
    third = w.counter_track("third", parent=heap.parent)
    seq = w.counter_sequence([heap, rss, third])
    samples = [
        (T0 + 5 * MS, 100, 200_000, None),
        (T0 + 15 * MS, 1_000_000, 300_000, None),
        (T0 + 25 * MS, 1_000_000, 310_000, None),  # only the second track changed
        (T0 + 35 * MS, 5, 310_000, None),  # only the first
        (T0 + 36 * MS, 6, None, 7),  # first and third: named extra
        (T0 + 37 * MS, None, 8, 9),  # no first: the second is named
        (T0 + 38 * MS, 6, 8, 9),  # nothing changed: nothing written
        (T0 + 6 * MS, 1, 2, 3),  # back in time: absolute timestamp
        (T0 + 46 * MS + 123, 2, 2, 3),  # after it, the delta chain goes on
    ]
    for ts, *values in samples:
        seq.sample(ts, *values)
    w.close()

    decoded = decode_counters(path)
    expected: dict[int, list[tuple[int, int]]] = {heap.uuid: [], rss.uuid: [], third.uuid: []}
    last: dict[int, int | None] = dict.fromkeys(expected)
    for ts, *values in samples:
        for track, value in zip((heap, rss, third), values, strict=True):
            if value is not None and value != last[track.uuid]:
                mult = track.unit_multiplier
                expected[track.uuid].append((ts // 1000 * 1000, value * mult))
                last[track.uuid] = value
    assert decoded.samples == expected
    # The same samples through tracer's reader (extra counter values included).
    model = read_trace(path)
    assert not model.problems, model.problems
    for track in (heap, rss, third):
        read = sorted((c.ts, c.value) for c in model.counters_on(track.uuid))
        assert read == sorted(expected[track.uuid]), track.name


def test_counter_sequence_sizes(tmp_path: Path) -> None:
    w = _writer(tmp_path / "s.pftrace")
    heap, rss = _pair(w)
    seq = w.counter_sequence([heap, rss])
    seq.sample(T0, 0, kib(90 * MIB))  # the first one also writes the setup packet
    sizes = []
    for i in range(1, 200):
        before = len(w._buf)
        seq.sample(T0 + i * 10 * MS, kib(i * 5 * MIB), kib(90 * MIB + i * MIB))
        sizes.append(len(w._buf) - before)
    # Both values, a 10 ms delta (2 bytes in µs), 3-byte KiB values: 20 bytes, 10 per sample.
    assert max(sizes) <= 20
    before = len(w._buf)
    # One value after a 1 s gap (3-byte delta): 16 bytes.
    seq.sample(T0 + 200 * 10 * MS + 1000 * MS, kib(3 * MIB), kib(90 * MIB + 199 * MIB))
    assert len(w._buf) - before <= 16
    w.close()


def test_counter_sequence_validation(tmp_path: Path) -> None:
    w = _writer(tmp_path / "v.pftrace")
    heap, rss = _pair(w)
    other = TraceWriter(tmp_path / "o.pftrace", clock=lambda: T0)
    foreign, _ = _pair(other)
    with pytest.raises(UnknownTrackError):
        w.counter_sequence([foreign])
    with pytest.raises(ValueError):
        w.counter_sequence([])
    with pytest.raises(ValueError):
        w.counter_sequence([heap, heap])
    seq = w.counter_sequence([heap, rss])
    with pytest.raises(ValueError):
        seq.sample(T0, 1)
    with pytest.raises(TypeError):
        seq.sample(T0, 1.5, 2)  # type: ignore[arg-type]
    a, b = w.counter_sequence([heap]), w.counter_sequence([rss])
    assert len({seq.sequence_id, a.sequence_id, b.sequence_id, 1}) == 4
    w.close()
    other.close()


def test_downsample_keeps_peaks() -> None:
    samples = [(i, (i * 7919) % 1000, 5000 - i) for i in range(1234)]
    out = downsample(samples, 200)
    assert len(out) == 200
    assert [s[0] for s in out] == sorted(s[0] for s in out)
    assert max(s[1] for s in out) == max(s[1] for s in samples)
    assert max(s[2] for s in out) == max(s[2] for s in samples)
    assert downsample(samples[:150], 200) == samples[:150]


def test_node_counters_only_up_to_the_watermark(tmp_path: Path) -> None:
    path = tmp_path / "n.pftrace"
    w = _writer(path)
    node = w.process_track(3, "Node 0")
    worker = w.thread_track(3, 4, "worker 4")
    mem = MemoryTrace(w, 2)

    def run(start: int, end: int, requested: int, peak: int) -> None:
        m = {"heap_peak": peak, "rss_peak": 100 * MIB, "rss_start": 90 * MIB, "rss_end": 95 * MIB}
        mem.execution(m, requested, node, worker, T0 + start * MS, T0 + end * MS)

    run(0, 10, 4 * MIB, 20 * MIB)
    run(5, 30, 4 * MIB, 2 * MIB)
    mem.settle(T0 + 5 * MS)  # a task still in flight was dispatched at 5 ms
    mem.settle(T0 + 5 * MS)  # idempotent
    w.flush()
    so_far = decode_counters(path)
    by_name = {so_far.names[u]: u for u in so_far.names}
    assert so_far.samples[by_name[L.COUNTER_NODE_MEMORY_REQUESTED]] == [
        (T0, 4 * MIB), (T0 + 5 * MS, 8 * MIB)
    ]
    run(20, 40, 0, 8 * MIB)  # arrives later, starts after the watermark
    mem.settle(None)
    w.close()

    decoded = decode_counters(path)
    by_name = {decoded.names[u]: u for u in decoded.samples}
    requested = decoded.samples[by_name[L.COUNTER_NODE_MEMORY_REQUESTED]]
    used = decoded.samples[by_name[L.COUNTER_NODE_MEMORY_USED]]
    assert requested == [
        (T0, 4 * MIB), (T0 + 5 * MS, 8 * MIB), (T0 + 10 * MS, 4 * MIB), (T0 + 30 * MS, 0)
    ]
    assert used == [
        (T0, 20 * MIB), (T0 + 5 * MS, 22 * MIB), (T0 + 10 * MS, 2 * MIB),
        (T0 + 20 * MS, 10 * MIB), (T0 + 30 * MS, 8 * MIB), (T0 + 40 * MS, 0),
    ]
    # No snapshots: the worker's heap is 0 at each start and end (written once: deduped).
    assert decoded.samples[by_name[L.COUNTER_WORKER_HEAP]] == [(T0, 0)]
    rss = decoded.samples[by_name[L.COUNTER_WORKER_RSS]]
    # Each settle writes its executions' samples sorted by time (starts 0, 5; ends 10, 30),
    # equal ones dropped; the third execution (20-40) came later, its start is written
    # with an absolute timestamp and lands at its true time.
    assert rss == [
        (T0, 90 * MIB), (T0 + 10 * MS, 95 * MIB), (T0 + 20 * MS, 90 * MIB), (T0 + 40 * MS, 95 * MIB)
    ]


def test_node_step_behind_the_watermark_is_clamped(tmp_path: Path) -> None:
    path = tmp_path / "late.pftrace"
    w = _writer(path)
    node = w.process_track(3, "Node 0")
    worker = w.thread_track(3, 4, "worker 4")
    mem = MemoryTrace(w, 1)
    mem.execution({"rss_peak": 10 * MIB}, 1 * MIB, node, worker, T0, T0 + 50 * MS)
    mem.settle(T0 + 60 * MS)
    # Clock skew: starts before what was written; it is moved to the last written time
    # (after the sample already written there: the later one wins, in file order).
    mem.execution({"rss_peak": 10 * MIB}, 2 * MIB, node, worker, T0 + 20 * MS, T0 + 70 * MS)
    mem.settle(None)
    w.close()
    decoded = decode_counters(path)
    by_name = {decoded.names[u]: u for u in decoded.samples}
    requested = decoded.samples[by_name[L.COUNTER_NODE_MEMORY_REQUESTED]]
    assert requested == [(T0, MIB), (T0 + 50 * MS, 0), (T0 + 50 * MS, 2 * MIB), (T0 + 70 * MS, 0)]


def test_execution_memory_args_and_flag(tmp_path: Path) -> None:
    w = _writer(tmp_path / "a.pftrace")
    node = w.process_track(3, "Node 0")
    worker = w.thread_track(3, 4, "worker 4")
    mem = MemoryTrace(w, 2)
    level2 = {
        "heap_peak": 9 * MIB, "allocations": 3, "heap_retained": MIB, "rss_peak": 120 * MIB,
        "rss_start": 100 * MIB, "rss_end": 101 * MIB,
        "memory_samples": [(T0 // MS + 1, 5 * MIB, 110 * MIB)],
    }
    args, peak, over = mem.execution(level2, 4 * MIB, node, worker, T0, T0 + 5 * MS)
    assert (peak, over) == (9 * MIB, True)
    assert args == {
        L.ARG_MEMORY_REQUESTED: 4 * MIB, L.ARG_MEMORY_PEAK: 9 * MIB, L.ARG_OVER_REQUEST: True,
        L.ARG_HEAP_PEAK: 9 * MIB, L.ARG_ALLOCATIONS: 3, L.ARG_HEAP_RETAINED: MIB,
        L.ARG_RSS_PEAK: 120 * MIB,
    }
    # No request: never over, but the 0 is written so that a query finds it.
    args, _, over = mem.execution(level2, 0, node, worker, T0 + 6 * MS, T0 + 7 * MS)
    assert not over and args[L.ARG_MEMORY_REQUESTED] == 0 and L.ARG_OVER_REQUEST not in args
    # memray unavailable: level-1 figures, marked.
    fallback = {"rss_peak": 120 * MIB, "memray": "unavailable", "memray_reason": "busy"}
    args, peak, over = mem.execution(fallback, 200 * MIB, node, worker, T0 + 8 * MS, T0 + 9 * MS)
    assert (peak, over) == (120 * MIB, False)
    assert args[L.ARG_MEMRAY] == "unavailable" and args[L.ARG_MEMRAY_REASON] == "busy"
    assert L.ARG_HEAP_PEAK not in args
    w.close()


def test_a_peak_no_snapshot_shows_gets_a_sample(tmp_path: Path) -> None:
    """memray snapshots every 10 ms: a task whose peak lasts less (or a task shorter
    than 10 ms) has no snapshot of it. The worker's heap counter still reaches it,
    where the worker says it fell, kept inside the execution."""
    path = tmp_path / "p.pftrace"
    w = _writer(path)
    node = w.process_track(3, "Node 0")
    worker = w.thread_track(3, 4, "worker 4")
    mem = MemoryTrace(w, 2)
    held = [(T0 // MS + 10, 2 * MIB, 100 * MIB), (T0 // MS + 20, 2 * MIB, 101 * MIB)]
    mem.execution(  # between two snapshots
        {"heap_peak": 24 * MIB, "memory_samples": held, "heap_peak_at_ns": T0 + 15 * MS},
        None, node, worker, T0, T0 + 30 * MS,
    )
    mem.execution(  # no snapshot at all; its time is kept inside the execution
        {"heap_peak": 8 * MIB, "heap_peak_at_ns": T0 + 99 * MS}, None, node, worker,
        T0 + 40 * MS, T0 + 42 * MS,
    )
    mem.execution({"heap_peak": 3 * MIB}, None, node, worker, T0 + 50 * MS, T0 + 52 * MS)
    mem.settle(None)
    w.close()
    decoded = decode_counters(path)
    by_name = {decoded.names[u]: u for u in decoded.samples}
    assert decoded.samples[by_name[L.COUNTER_WORKER_HEAP]] == [
        (T0, 0), (T0 + 10 * MS, 2 * MIB), (T0 + 15 * MS, 24 * MIB), (T0 + 20 * MS, 2 * MIB),
        (T0 + 30 * MS, 0), (T0 + 42 * MS, 8 * MIB), (T0 + 42 * MS, 0),
    ]  # (the third has no time for its peak: none is made up; the node's counter has it)


def test_the_peak_time_is_the_middle_of_its_gap() -> None:
    snaps = [(100, MIB, 0), (110, MIB, 0), (120, MIB, 0)]
    start, end = 95 * MS, 125 * MS
    assert peak_time(snaps, 0, start, end) == (95 * MS + 100 * MS) // 2
    assert peak_time(snaps, 2, start, end) == 115 * MS
    assert peak_time(snaps, 3, start, end) == (120 * MS + 125 * MS) // 2
    assert peak_time(snaps, None, start, end) == 110 * MS  # unknown: the task's middle
    assert peak_time([], 0, start, end) == 110 * MS
    assert peak_time(snaps, 0, None, end) is None
    m: dict = {"start_ns": start, "end_ns": end}
    put_figures(m, 24 * MIB, 2, 0, snaps, peak_after=1)
    assert m["heap_peak_at_ns"] == 105 * MS
    shown: dict = {"start_ns": start, "end_ns": end}
    put_figures(shown, MIB, 2, 0, snaps, peak_after=1)  # a snapshot shows it
    assert "heap_peak_at_ns" not in shown

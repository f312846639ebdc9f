"""The driver's Python GC in the trace: long pauses under the dispatch loop, totals on the run.

A collection holds the GIL, so a dispatch loop stands still while one runs,
whichever thread set it off; a full collection of a big driver heap takes tens
of ms. These tests make real collections of a real heap (no fake callbacks)
and read the trace with tracer's reader and with trace_processor.
"""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from engines_agree import assert_engines_agree

from tracer.format import TraceWriter, read_trace
from tracer.query import QueryConfig, TraceQuery, records
from tracer.ray import ResourceRequest, ray_tracer, wait_for_traces
from tracer.ray import layout as L
from tracer.ray.driver_gc import MIN_PAUSE_NS, DriverGC
from tracer.ray.timeline import RunTimeline, TimelineTask
from tracer.runner import Pipeline, Stage

MS = 1_000_000


def _garbage_cycles(n: int) -> None:
    """``n`` unreachable reference cycles, for a collection to find."""
    for _ in range(n):
        a: list[Any] = []
        a.append(a)


def _full_collection_of_a_big_heap() -> list[Any]:
    """A heap of ~400,000 tracked objects (a full collection walks each), and a full
    collection of it, the only one meanwhile (so that it finds the 1000 cycles made for
    it); returns the heap (keep it alive until the collection is done)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        heap = [[i] for i in range(400_000)]
        _garbage_cycles(1000)
    finally:
        if enabled:
            gc.enable()
    gc.collect()
    return heap


def test_a_long_collection_is_a_slice_under_the_loop(
    tmp_path: Path, trace_processor_bin: str
) -> None:
    path = tmp_path / "gc.perfetto-trace"
    callbacks = list(gc.callbacks)
    gc.collect()  # no automatic collection of what came before lands in the run
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="gc", runner_name="engine")
        assert len(gc.callbacks) == len(callbacks) + 1  # recording while the run is open
        tl.begin_loop(L.SLICE_WAVE, {L.ARG_WAVE: 0})
        task = tl.task_created(TimelineTask, "t0", 0, ResourceRequest(num_cpus=1), w.now(),
                               stage_name="map")
        heap = _full_collection_of_a_big_heap()
        tl.draw_driver_gc()  # what a flush does
        tl.task_ended(task, w.now(), None)
        tl.end_loop()
        tl.stage_done(0)
        gc.collect()  # a second one, drawn by the run's end
        del heap
        tl.close()
    assert gc.callbacks == callbacks  # the run's end stopped recording

    model = read_trace(path, strict=True)
    (loop,) = [t for t in model.tracks.values() if t.name == L.DISPATCH_LOOP_THREAD]
    (gc_track,) = [t for t in model.tracks.values() if t.name == L.DRIVER_GC_TRACK]
    assert gc_track.parent_uuid == loop.uuid
    pauses = [s for s in model.slices if s.track_uuid == gc_track.uuid]
    assert len(pauses) >= 2
    first = pauses[0]
    assert first.name == f"{L.SLICE_GC_PREFIX}2)" and first.category == L.CAT_SCHEDULER
    assert first.dur is not None and first.dur >= MIN_PAUSE_NS
    assert first.args[L.ARG_GC_GENERATION] == 2
    assert first.args[L.ARG_GC_COLLECTED] >= 1000
    assert first.args[L.ARG_GC_THREAD] == threading.current_thread().name
    (run,) = [s for s in model.slices if s.name == L.SLICE_EXECUTION]
    assert run.ts <= first.ts and first.ts + first.dur <= run.ts + (run.dur or 0)
    assert run.args[L.ARG_DRIVER_GC_COLLECTIONS] >= len(pauses)
    assert run.args[L.ARG_DRIVER_GC_NS] >= sum(p.dur or 0 for p in pauses)
    assert run.args[L.ARG_DRIVER_GC_LONGEST_NS] >= max(p.dur or 0 for p in pauses)

    # trace_processor: the same pauses, on a track under the dispatch loop's.
    config = QueryConfig(engine="trace_processor", trace_processor_path=trace_processor_bin)
    with TraceQuery(path, config) as q:
        rows = records(q.query(
            "SELECT s.name, s.dur, EXTRACT_ARG(s.arg_set_id, 'debug.generation') AS gen, "
            "t.name AS track, p.name AS parent FROM slice AS s "
            "JOIN track AS t ON s.track_id = t.id JOIN track AS p ON t.parent_id = p.id "
            "WHERE s.name GLOB 'Python GC*' ORDER BY s.ts"
        ))
        info = q.run_info()
    assert [(r["name"], r["dur"], r["gen"]) for r in rows] == [
        (p.name, p.dur, p.args[L.ARG_GC_GENERATION]) for p in pauses]
    assert {(r["track"], r["parent"]) for r in rows} == {
        (L.DRIVER_GC_TRACK, L.DISPATCH_LOOP_THREAD)}
    assert info[L.ARG_DRIVER_GC_NS] == run.args[L.ARG_DRIVER_GC_NS]
    assert info[L.ARG_DRIVER_GC_COLLECTIONS] == run.args[L.ARG_DRIVER_GC_COLLECTIONS]
    assert_engines_agree(path, trace_processor_bin)


def test_short_collections_are_counted_not_drawn(tmp_path: Path) -> None:
    path = tmp_path / "short.perfetto-trace"
    gc.collect()
    gc.disable()  # only these collections: no automatic one (a full one may take ms)
    try:
        with TraceWriter(path) as w:
            tl = RunTimeline(w, execution_id="short", runner_name="engine")
            for _ in range(20):
                gc.collect(0)  # a young collection of a small generation: µs
            tl.close()
    finally:
        gc.enable()
    model = read_trace(path, strict=True)
    (run,) = [s for s in model.slices if s.name == L.SLICE_EXECUTION]
    assert run.args[L.ARG_DRIVER_GC_COLLECTIONS] == 20
    assert 0 < run.args[L.ARG_DRIVER_GC_LONGEST_NS] < MIN_PAUSE_NS
    assert L.DRIVER_GC_TRACK not in {t.name for t in model.tracks.values()}  # nothing to draw


def test_without_the_recorder_nothing_is_recorded(tmp_path: Path) -> None:
    """``driver_gc=False``: no callback, no track, no totals."""
    path = tmp_path / "off.perfetto-trace"
    callbacks = list(gc.callbacks)
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="off", runner_name="engine", driver_gc=False)
        assert gc.callbacks == callbacks
        heap = _full_collection_of_a_big_heap()
        tl.draw_driver_gc()
        del heap
        tl.close()
    model = read_trace(path, strict=True)
    (run,) = [s for s in model.slices if s.name == L.SLICE_EXECUTION]
    assert L.ARG_DRIVER_GC_COLLECTIONS not in run.args
    assert L.DRIVER_GC_TRACK not in {t.name for t in model.tracks.values()}


def test_the_recorder_keeps_a_bounded_number_of_pauses() -> None:
    """Nobody draining (tracing stopped): the oldest pauses go, counted; never unbounded."""
    rec = DriverGC(min_pause_ns=0, max_kept=3)
    rec.start()
    rec.start()  # idempotent: one callback
    gc.disable()  # only these collections: no automatic one
    try:
        assert gc.callbacks.count(rec._callback) == 1
        for _ in range(5):
            gc.collect(0)
    finally:
        gc.enable()
        rec.stop()
        rec.stop()
    assert rec._callback not in gc.callbacks
    assert rec.collections == 5
    assert rec.dropped == 2
    pauses = rec.take()
    assert len(pauses) == 3
    assert [p.start_ns for p in pauses] == sorted(p.start_ns for p in pauses)
    assert all(p.generation == 0 and p.end_ns >= p.start_ns for p in pauses)
    assert rec.take() == []
    gc.collect(0)
    assert rec.take() == []  # stopped: nothing more


def test_the_callback_never_raises() -> None:
    """Python prints what a gc callback raises, at every collection: it must not raise, even
    on an info it cannot read."""
    rec = DriverGC(min_pause_ns=0)
    rec._callback("start", {})
    rec._callback("stop", {"generation": "not a number"})  # the pause is not kept ...
    assert rec.take() == []
    rec._callback("start", {})
    rec._callback("stop", {"generation": 1, "collected": 2, "uncollectable": 0})  # ... this is
    (pause,) = rec.take()
    assert (pause.generation, pause.collected) == (1, 2)


@pytest.mark.parametrize(("option", "value"), [
    ("min_pause_ns", -1), ("min_pause_ns", 1.5), ("max_kept", 0), ("max_kept", True)])
def test_the_recorder_refuses_bad_options(option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=option):
        DriverGC(**{option: value})


def test_a_discarded_timeline_stops_recording(tmp_path: Path) -> None:
    """A producer that never ends its run (its tracing failed) leaves no callback behind."""
    callbacks = list(gc.callbacks)
    w = TraceWriter(tmp_path / "dropped.perfetto-trace")
    tl = RunTimeline(w, execution_id="dropped", runner_name="engine")
    assert len(gc.callbacks) == len(callbacks) + 1
    del tl
    gc.collect()
    assert gc.callbacks == callbacks
    w.close()


@pytest.mark.usefixtures("ray_local")
def test_a_traced_run_shows_a_collection_another_driver_thread_set_off(
    tmp_path: Path, trace_processor_bin: str
) -> None:
    """A real run of the reference runner at level 1; a driver thread runs a full collection
    of a big heap meanwhile: the run's result is untouched, the pause is on the loop's GC
    track (drawn by a flush or the run's end), named by the thread that set it off."""
    def slow(x: int) -> int:
        time.sleep(0.05)
        return x * 2

    started = threading.Event()
    done = threading.Event()

    def collect() -> None:
        started.wait(10)
        heap = _full_collection_of_a_big_heap()
        del heap
        done.set()

    def partitions() -> Any:
        started.set()
        yield from range(8)
        done.wait(10)  # the collection happens while the run is open

    collector = threading.Thread(target=collect, name="heap-collector")
    collector.start()
    path = tmp_path / "run.perfetto-trace"
    result = Pipeline(partitions(), [Stage("slow", slow)]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    collector.join()
    assert result == [i * 2 for i in range(8)]
    wait_for_traces()
    model = read_trace(path, strict=True)
    (gc_track,) = [t for t in model.tracks.values() if t.name == L.DRIVER_GC_TRACK]
    pauses = [s for s in model.slices if s.track_uuid == gc_track.uuid]
    mine = [p for p in pauses if p.args[L.ARG_GC_THREAD] == "heap-collector"]
    assert mine and mine[0].name == f"{L.SLICE_GC_PREFIX}2)"
    (run,) = [s for s in model.slices if s.name == L.SLICE_EXECUTION]
    # The run's trace is in µs: a slice's ends are rounded down each, its length by up to 1 µs.
    assert run.args[L.ARG_DRIVER_GC_LONGEST_NS] >= mine[0].dur - 1000
    config = QueryConfig(engine="trace_processor", trace_processor_path=trace_processor_bin)
    with TraceQuery(path, config) as q:
        assert q.run_info()[L.ARG_DRIVER_GC_COLLECTIONS] == run.args[
            L.ARG_DRIVER_GC_COLLECTIONS]


@pytest.mark.usefixtures("ray_local")
def test_a_flush_writes_the_pauses_while_the_run_is_open(tmp_path: Path) -> None:
    """A driver killed mid-run keeps what was flushed: the pauses are drawn at each flush,
    not only at the run's end."""
    path = tmp_path / "flushed.perfetto-trace"
    with ray_tracer("flushed", level=1, path=path) as tracer:
        with tracer.dispatch_wave(0):
            heap = _full_collection_of_a_big_heap()
            del heap
        tracer.flush()
        model = read_trace(path)  # the run is still open: its slice never ended yet
        names = {t.name for t in model.tracks.values()}
        assert L.DRIVER_GC_TRACK in names
        assert any(s.name == f"{L.SLICE_GC_PREFIX}2)" for s in model.slices)

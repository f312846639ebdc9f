"""TraceWriter refuses bad input at the call, clearly, and never leaves a corrupt file.

Each misuse raises where it happens; the writer then keeps going, and the file
(read back in strict mode) holds exactly the events that were accepted. Memory
stays bounded however long the trace.

The tests run as root, so a chmod'ed folder would not stop a write: unwritable
paths are a path under a regular file, a name under /proc, and /dev/full.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trace_helpers import FakeClock

import tracer.format._events as events_module
from tracer.errors import (
    InvalidArgumentTypeError,
    TracerError,
    TraceWriteError,
    TraceWriterClosedError,
    UnknownTrackError,
)
from tracer.format import CounterTrack, TraceWriter, Track, read_trace
from tracer.format._encoding import _SEEN_ONCE_LIMIT

T0 = 1_000_000_000


# ------------------------------------------------------------- where to write

def test_missing_folder(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "folder" / "t.perfetto-trace"
    with pytest.raises(TraceWriteError, match="does not exist") as info:
        TraceWriter(path)
    assert str(path) in str(info.value)
    assert not path.parent.exists()


def test_parent_is_a_regular_file(tmp_path: Path) -> None:
    parent = tmp_path / "a-file"
    parent.write_text("not a folder")
    with pytest.raises(TraceWriteError, match="is not a folder"):
        TraceWriter(parent / "t.perfetto-trace")
    with pytest.raises(TraceWriteError, match="is not a folder"):
        TraceWriter("/proc/version/t.perfetto-trace")


def test_path_is_a_folder(tmp_path: Path) -> None:
    with pytest.raises(TraceWriteError, match="it is a folder"):
        TraceWriter(tmp_path)


def test_a_fifo_nobody_reads_is_refused_not_waited_on(tmp_path: Path) -> None:
    """open() of a FIFO waits for a reader: forever, for a trace path given by mistake."""
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def open_it() -> None:
        try:
            TraceWriter(fifo)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=open_it, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # unblock it: a reader comes, and the writer's open returns
        with open(fifo, "rb"):
            pass
        pytest.fail("TraceWriter waited for a reader of the FIFO")
    (exc,) = outcome
    assert isinstance(exc, TraceWriteError) and "no process is reading" in str(exc)


def test_an_uncompressed_trace_streams_to_a_fifo_someone_reads(tmp_path: Path) -> None:
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    writer = None
    for _ in range(200):  # until the reader's open is under way
        try:
            writer = TraceWriter(fifo, compress=False)
            break
        except TraceWriteError as exc:
            assert "no process is reading" in str(exc)
            threading.Event().wait(0.05)
    assert writer is not None
    with writer as w:
        track = w.track("lane")
        w.begin(track, "work")
        w.end(track)
    reader.join(10)
    assert [s.name for s in read_trace(got[0]).slices] == ["work"]


def test_a_folder_root_cannot_write_into() -> None:
    path = Path(f"/proc/tracer-test-{os.getpid()}.perfetto-trace")
    with pytest.raises(TraceWriteError, match="cannot create trace file") as info:
        TraceWriter(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, OSError) and isinstance(info.value, TracerError)


def test_a_full_disk_raises_at_flush_and_close() -> None:
    w = TraceWriter("/dev/full", clock=FakeClock(T0))
    lane = w.track("lane")
    w.begin(lane, "a", T0 + 1)
    with pytest.raises(TraceWriteError, match="No space left"):
        w.flush()
    w.end(lane, T0 + 2)
    with pytest.raises(TraceWriteError, match="No space left"):
        w.close()
    assert w.closed
    with pytest.raises(TraceWriterClosedError):
        w.begin(lane, "b", T0 + 3)


@pytest.mark.parametrize(
    "options",
    [{"buffer_size": 1023}, {"compression_level": 10}, {"compression_level": -1},
     {"sequence_id": 0}, {"sequence_id": 1 << 32}],
)
def test_bad_writer_options(tmp_path: Path, options: dict[str, Any]) -> None:
    path = tmp_path / "t.perfetto-trace"
    with pytest.raises(ValueError, match=next(iter(options))):
        TraceWriter(path, **options)
    assert not path.exists()


@pytest.mark.parametrize(
    "options",
    [{"buffer_size": "4096"}, {"compression_level": 6.0}, {"sequence_id": True}],
)
def test_writer_options_of_the_wrong_type(tmp_path: Path, options: dict[str, Any]) -> None:
    path = tmp_path / "t.perfetto-trace"
    with pytest.raises(InvalidArgumentTypeError, match=f"{next(iter(options))} must be an int"):
        TraceWriter(path, **options)
    assert not path.exists()


class _Big(int):
    """An int subclass (numpy-like wrappers, enums): takes the counter's slower branch."""


# --------------------------------------------- misuse at the call, file stays clean

Misuse = Callable[[TraceWriter, dict[str, Any]], object]

MISUSES: dict[str, tuple[type[Exception], str, Misuse]] = {
    "unknown counter unit": (ValueError, "unknown counter unit",
                             lambda w, t: w.counter_track("c", unit="kg")),  # type: ignore[arg-type]
    "counter without unit": (ValueError, "needs a unit",
                             lambda w, t: w.counter_track("c", unit=None)),
    "unit multiplier 0": (ValueError, "unit_multiplier",
                          lambda w, t: w.counter_track("c", unit_multiplier=0)),
    "unknown child ordering": (ValueError, "child_ordering",
                               lambda w, t: w.track("x", child_ordering="random")),  # type: ignore[arg-type]
    "counter as parent": (ValueError, "cannot be a parent",
                          lambda w, t: w.track("x", parent=t["counter"])),
    "pid 0": (ValueError, "pid must be a positive int",
              lambda w, t: w.process_track(0, "p")),
    "negative pid": (ValueError, "pid", lambda w, t: w.process_track(-3, "p")),
    "pid too big": (ValueError, "pid", lambda w, t: w.process_track(1 << 31, "p")),
    "pid is a bool": (ValueError, "pid", lambda w, t: w.process_track(True, "p")),
    "pid is a str": (ValueError, "pid", lambda w, t: w.process_track("5", "p")),  # type: ignore[arg-type]
    "duplicate pid": (ValueError, "already has a process track",
                      lambda w, t: w.process_track(10, "again")),
    "tid 0": (ValueError, "tid", lambda w, t: w.thread_track(10, 0, "t")),
    # trace_processor truncates tids to 32 bits.
    "tid 2**32": (ValueError, "tid", lambda w, t: w.thread_track(10, 1 << 32, "t")),
    "duplicate thread": (ValueError, "already has a track",
                         lambda w, t: w.thread_track(10, 11, "again")),
    "negative rank": (ValueError, "rank", lambda w, t: w.track("x", rank=-1)),
    "rank too big": (ValueError, "rank", lambda w, t: w.process_track(77, "p", rank=1 << 31)),
    "rank is a bool": (ValueError, "rank", lambda w, t: w.thread_track(10, 99, "t", rank=True)),
    "name not a str": (TypeError, "name must be a str",
                       lambda w, t: w.begin(t["lane"], 5, T0 + 1)),  # type: ignore[arg-type]
    "category not a str": (TypeError, "category",
                           lambda w, t: w.begin(t["lane"], "fresh", T0 + 1, category=3)),  # type: ignore[arg-type]
    "flow id 0": (ValueError, "flow id", lambda w, t: w.begin(t["lane"], "f", T0 + 1, flows=[0])),
    "flow id negative": (ValueError, "flow id",
                         lambda w, t: w.instant(t["lane"], "f", T0 + 1, flows=[1, -1])),
    "flow id too big": (ValueError, "flow id",
                        lambda w, t: w.end(t["lane"], T0 + 1, flows=[1 << 64])),
    "flow id is a bool": (ValueError, "flow id",
                          lambda w, t: w.begin(t["lane"], "f", T0 + 1,
                                               terminating_flows=[True])),
    "args not a mapping": (TypeError, "args must be a mapping",
                           lambda w, t: w.begin(t["lane"], "fresh", T0 + 1, args=[("a", 1)])),  # type: ignore[arg-type]
    "arg name not a str": (TypeError, "annotation names must be str",
                           lambda w, t: w.begin(t["lane"], "fresh", T0 + 1,
                                                category="new-cat",
                                                args={"ok": "new value", 1: "x"})),
    "args nested too deep": (ValueError, "nested deeper",
                             lambda w, t: w.instant(t["lane"], "fresh", T0 + 1,
                                                    args={"d": _deep(40)})),
    "negative late timestamp": (ValueError, "negative",
                                lambda w, t: w.begin(t["lane"], "fresh-late", -5)),
    "begin at a float timestamp": (TypeError, "timestamp must be an int",
                                   lambda w, t: w.begin(t["lane"], "fresh", T0 + 1.0)),  # type: ignore[arg-type]
    "late begin at a float timestamp": (TypeError, "timestamp must be an int",
                                        lambda w, t: w.begin(t["lane"], "x", 5.5)),  # type: ignore[arg-type]
    "begin with args at a str timestamp": (TypeError, "timestamp must be an int",
                                           lambda w, t: w.begin(t["lane"], "fresh", "T0",  # type: ignore[arg-type]
                                                                args={"ok": 1})),
    "end at a float timestamp": (TypeError, "timestamp must be an int",
                                 lambda w, t: w.end(t["lane"], T0 + 1.0)),  # type: ignore[arg-type]
    "counter at a float timestamp": (TypeError, "timestamp must be an int",
                                     lambda w, t: w.counter(t["counter"], 5, T0 + 1.0)),  # type: ignore[arg-type]
    "complete ends before it starts": (ValueError, "ends",
                                       lambda w, t: w.complete(t["lane"], "c", T0 + 5, T0 + 4)),
    "slice on a counter track": (ValueError, "counter track",
                                 lambda w, t: w.begin(t["counter"], "x", T0 + 1)),
    "counter value is a bool": (TypeError, "counter value",
                                lambda w, t: w.counter(t["counter"], True, T0 + 1)),
    "counter value is a str": (TypeError, "counter value",
                               lambda w, t: w.counter(t["counter"], "5", T0 + 1)),  # type: ignore[arg-type]
    "counter value over int64": (OverflowError, "int64",
                                 lambda w, t: w.counter(t["counter"], 1 << 63, T0 + 1)),
    "counter value of an int subclass over int64": (
        OverflowError, "int64", lambda w, t: w.counter(t["counter"], _Big(1 << 63), T0 + 1)),
    "counter on a slice track": (UnknownTrackError, "not a counter track",
                                 lambda w, t: w.counter(t["lane"], 1, T0 + 1)),  # type: ignore[arg-type]
    "begin on another writer's track": (UnknownTrackError, "not declared on this writer",
                                        lambda w, t: w.begin(t["foreign"], "x", T0 + 1)),
    "end on another writer's track": (UnknownTrackError, "not declared on this writer",
                                      lambda w, t: w.end(t["foreign"], T0 + 1)),
    "instant on a made-up track": (UnknownTrackError, "not declared on this writer",
                                   lambda w, t: w.instant(Track(1, "lane", "track", None), "x",
                                                          T0 + 1)),
    "counter on another writer's track": (UnknownTrackError, "not a counter track",
                                          lambda w, t: w.counter(t["foreign_counter"], 1,
                                                                 T0 + 1)),
    "parent from another writer": (UnknownTrackError, "not declared on this writer",
                                   lambda w, t: w.track("x", parent=t["foreign"])),
    "counter sequence of a slice track": (UnknownTrackError, "not a counter track",
                                          lambda w, t: w.counter_sequence([t["lane"]])),  # type: ignore[list-item]
    "counter sequence of no track": (ValueError, "1 to 9 tracks",
                                     lambda w, t: w.counter_sequence([])),
}


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"k": value}
    return value


@pytest.mark.parametrize("case", sorted(MISUSES))
def test_misuse_raises_at_the_call_and_the_file_stays_clean(tmp_path: Path, case: str) -> None:
    error, message, misuse = MISUSES[case]
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(tmp_path / "other.perfetto-trace") as other:
        foreign = other.track("lane")
        foreign_counter = other.counter_track("c")
    with TraceWriter(path, clock=FakeClock(T0), buffer_size=1024) as w:
        process = w.process_track(10, "proc")
        thread = w.thread_track(10, 11, "loop")
        lane = w.track("lane", parent=process)
        counter = w.counter_track("counter")
        tracks = {"lane": lane, "counter": counter, "foreign": foreign,
                  "foreign_counter": foreign_counter}
        w.begin(thread, "before", T0, args={"ok": "new value"})
        with pytest.raises(error, match=message):
            misuse(w, tracks)
        # The writer goes on; names first seen in the rejected call work.
        w.begin(lane, "fresh", T0 + 10, category="new-cat", args={"ok": "new value"})
        w.instant(lane, "fresh", T0 + 11, flows=[1])
        w.begin(lane, "fresh-late", T0 + 12, terminating_flows=[1])
        w.end(lane, T0 + 13)
        w.end(lane, T0 + 14, args={"d": _deep(3)})
        w.counter(counter, 5, T0 + 15)
        w.end(thread, T0 + 16)
    model = read_trace(path, strict=True)
    assert [(s.name, s.category, s.ts, s.dur, s.args) for s in model.slices] == [
        ("before", None, T0, 16, {"ok": "new value"}),
        ("fresh", "new-cat", T0 + 10, 4, {"ok": "new value", "d": _deep(3)}),
        ("fresh-late", None, T0 + 12, 1, {}),
    ]
    assert [(i.name, i.ts) for i in model.instants] == [("fresh", T0 + 11)]
    assert [(c.ts, c.value) for c in model.counters] == [(T0 + 15, 5)]
    assert len(model.flows) == 1
    assert {t.name for t in model.tracks.values()} == {"proc", "loop", "lane", "counter"}


def test_every_misuse_is_a_tracer_error(tmp_path: Path) -> None:
    not_tracer_errors = []
    with TraceWriter(tmp_path / "other.perfetto-trace") as other:
        foreign = other.track("lane")
        foreign_counter = other.counter_track("c")
    for case, (_, _, misuse) in sorted(MISUSES.items()):
        with TraceWriter(tmp_path / "t.perfetto-trace", clock=FakeClock(T0)) as w:
            w.process_track(10, "proc")
            w.thread_track(10, 11, "loop")
            tracks = {"lane": w.track("lane"), "counter": w.counter_track("counter"),
                      "foreign": foreign, "foreign_counter": foreign_counter}
            try:
                misuse(w, tracks)
            except TracerError:
                pass
            except Exception:
                not_tracer_errors.append(case)
    assert not_tracer_errors == []


def test_rejected_events_do_not_change_what_is_interned(tmp_path: Path) -> None:
    """A regression test: rejected calls used to leave iids that were never written."""
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        lane = w.track("lane")
        for bad in (
            lambda: w.begin(lane, "n1", T0 + 1, category="c1", args={"k1": "v", 2: 0}),
            lambda: w.instant(lane, "n2", T0 + 1, args={"k2": "v", "deep": _deep(40)}),
            lambda: w.begin(lane, "n3", -1),
            lambda: w.instant(lane, "n4", T0 + 1, category="c4", flows=[0]),
        ):
            with pytest.raises((TypeError, ValueError)):
                bad()
        for i in range(2):  # twice: the second time from the writer's caches
            w.begin(lane, "n1", T0 + 10 + 10 * i, category="c1", args={"k1": "v"})
            w.instant(lane, "n2", T0 + 11 + 10 * i, args={"k2": "v"})
            w.instant(lane, "n4", T0 + 12 + 10 * i, category="c4")
            w.begin(lane, "n3", T0 + 13 + 10 * i)
            w.end(lane, T0 + 14 + 10 * i)
            w.end(lane, T0 + 15 + 10 * i)
    model = read_trace(path, strict=True)
    assert [(s.name, s.category, s.args) for s in model.slices] == [
        ("n1", "c1", {"k1": "v"}), ("n3", None, {})] * 2
    assert [(i.name, i.category, i.args) for i in model.instants] == [
        ("n2", None, {"k2": "v"}), ("n4", "c4", {})] * 2


@pytest.mark.parametrize("gap", [1, 200, 20_000, 3_000_000, -5])  # each way a delta is written
def test_a_timestamp_that_is_not_an_int_writes_nothing_and_moves_no_clock(
    tmp_path: Path, gap: int
) -> None:
    """A float (or numpy float) timestamp on the cached hot path once left half a
    packet in the buffer (the rest of the file unreadable), or moved the clock so
    that later events landed at the wrong time."""
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        lane = w.track("lane")
        counter = w.counter_track("counter")
        w.begin(lane, "a", T0 + 10_000)  # cached from here on
        w.end(lane, T0 + 10_001)
        w.instant(lane, "i", T0 + 10_002)
        w.counter(counter, 1, T0 + 10_003)
        bad = float(T0 + 10_003 + gap)
        for call in (
            lambda: w.begin(lane, "a", bad),  # type: ignore[arg-type]
            lambda: w.end(lane, bad),  # type: ignore[arg-type]
            lambda: w.instant(lane, "i", bad),  # type: ignore[arg-type]
            lambda: w.counter(counter, 2, bad),  # type: ignore[arg-type]
            lambda: w.begin(lane, "with args", bad, args={"k": 1}),  # type: ignore[arg-type]
            lambda: w.begin(lane, "a", str(bad)),  # type: ignore[arg-type]
        ):
            with pytest.raises(InvalidArgumentTypeError, match="timestamp must be an int"):
                call()
        later = T0 + 10_003 + abs(gap) + 7
        w.begin(lane, "a", later)
        w.end(lane, later + 1)
        w.instant(lane, "i", later + 2)
        w.counter(counter, 3, later + 3)
    model = read_trace(path, strict=True)
    assert [(s.name, s.ts, s.dur) for s in model.slices] == [
        ("a", T0 + 10_000, 1), ("a", later, 1)]
    assert [(i.name, i.ts) for i in model.instants] == [("i", T0 + 10_002), ("i", later + 2)]
    assert [(c.ts, c.value) for c in model.counters] == [(T0 + 10_003, 1), (later + 3, 3)]


# ----------------------------------------------------------------- after close

@pytest.mark.parametrize(
    "call",
    [
        lambda w, t, c: w.begin(t, "a", T0 + 1),
        lambda w, t, c: w.begin(t, "new name", T0 + 1, args={"k": 1}),
        lambda w, t, c: w.end(t, T0 + 1),
        lambda w, t, c: w.instant(t, "i", T0 + 1),
        lambda w, t, c: w.complete(t, "a", T0 + 1, T0 + 2),
        lambda w, t, c: w.counter(c, 5, T0 + 1),  # the same value as the last one
        lambda w, t, c: w.counter(c, 6, T0 + 1),
        lambda w, t, c: w.track("new"),
        lambda w, t, c: w.process_track(3, "p", rank=1),
        lambda w, t, c: w.counter_sequence([c]).sample(T0 + 1, 1),
    ],
)
def test_writing_after_close_raises(tmp_path: Path, call: Callable[..., object]) -> None:
    path = tmp_path / "t.perfetto-trace"
    w = TraceWriter(path, clock=FakeClock(T0))
    lane = w.track("lane")
    counter = w.counter_track("c")
    w.begin(lane, "a", T0)
    w.end(lane, T0 + 1)
    w.counter(counter, 5, T0 + 1)
    w.close()
    size = path.stat().st_size
    with pytest.raises(TraceWriterClosedError, match="closed"):
        call(w, lane, counter)
    with pytest.raises(TraceWriterClosedError):  # and again: nothing was remembered
        call(w, lane, counter)
    w.close()  # closing twice is fine
    w.flush()
    assert path.stat().st_size == size
    assert len(read_trace(path, strict=True).slices) == 1


@pytest.mark.parametrize("bad", [1 << 63, "5"])
def test_a_rejected_counter_value_is_rejected_every_time(tmp_path: Path, bad: object) -> None:
    with TraceWriter(tmp_path / "t.perfetto-trace", clock=FakeClock(T0)) as w:
        counter = w.counter_track("c")
        for _ in range(2):
            with pytest.raises((OverflowError, TypeError)):
                w.counter(counter, bad, T0 + 1)  # type: ignore[arg-type]


def test_end_on_a_counter_track_raises(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        counter = w.counter_track("c")
        with pytest.raises(ValueError, match="counter track"):
            w.end(counter, T0 + 1)
    assert read_trace(path, strict=True).problems == []


def test_closed_writer_errors_are_tracer_errors() -> None:
    assert issubclass(TraceWriterClosedError, TracerError)
    assert issubclass(UnknownTrackError, TracerError)
    assert issubclass(TraceWriteError, TracerError)


# ------------------------------------------------------------------- bounded memory

@pytest.mark.parametrize("compress", [False, True])
def test_buffer_never_exceeds_buffer_size_plus_one_packet(tmp_path: Path, compress: bool) -> None:
    path = tmp_path / "t.perfetto-trace"
    limit = 4096
    largest = 0
    with TraceWriter(path, clock=FakeClock(T0), buffer_size=limit, compress=compress) as w:
        lanes = [w.track("task") for _ in range(32)]
        counter = w.counter_track("c", dedupe=False)
        now = T0
        for i in range(50_000):
            lane = lanes[i % 32]
            now += 700
            w.begin(lane, "task", now, args={"i": i} if i % 50 == 0 else None)
            largest = max(largest, len(w._buf))
            w.instant(lane, "tick", now + 1)
            largest = max(largest, len(w._buf))
            w.counter(counter, i, now + 2)
            largest = max(largest, len(w._buf))
            w.end(lane, now + 3)
            largest = max(largest, len(w._buf))
        written_before_close = w.bytes_written
    assert largest < limit  # flushed as soon as it reaches the limit
    assert written_before_close > 20 * limit
    model = read_trace(path, strict=True)
    assert len(model.slices) == 50_000 and len(model.counters) == 50_000


def test_a_huge_event_is_flushed_on_its_own(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0), buffer_size=1024) as w:
        lane = w.track("lane")
        w.instant(lane, "big", T0 + 1, args={"blob": "x" * 100_000})
        assert len(w._buf) == 0
        w.instant(lane, "small", T0 + 2)
        assert 0 < len(w._buf) < 1024
    assert [i.name for i in read_trace(path, strict=True).instants] == ["big", "small"]


def test_intern_tables_stop_at_intern_limit(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    limit = 50
    with TraceWriter(path, clock=FakeClock(T0), intern_limit=limit) as w:
        lane = w.track("lane")
        for i in range(2000):
            w.instant(lane, f"name-{i}", T0 + i, category=f"cat-{i % 500}",
                      args={f"key-{i}": f"value-{i % 300}", "same": f"value-{i % 300}"})
        assert len(w._names) == limit
        assert len(w._categories) == limit
        assert len(w._arg_names) == limit
        assert len(w._string_values) <= limit
        assert len(w._seen_once) <= _SEEN_ONCE_LIMIT
    model = read_trace(path, strict=True)
    assert [i.name for i in model.instants] == [f"name-{i}" for i in range(2000)]
    assert model.instants[1999].args == {"key-1999": "value-199", "same": "value-199"}
    assert model.instants[1999].category == "cat-499"


def test_event_caches_stop_growing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "_BODY_CACHE_LIMIT", 100)
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        lane = w.track("lane")
        for i in range(1000):
            w.instant(lane, f"i{i}", T0 + 2 * i)
            w.begin(lane, f"b{i}", T0 + 2 * i + 1)
            w.end(lane, T0 + 2 * i + 1)
        cached = sum(len(v) for v in w._begin_cache.values()) + sum(
            len(v) for v in w._instant_cache.values()
        )
        assert cached <= 200
    model = read_trace(path, strict=True)
    assert len(model.instants) == 1000 and len(model.slices) == 1000


def test_counter_tracks_are_counter_track_instances(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "t.perfetto-trace") as w:
        assert isinstance(w.counter_track("c"), CounterTrack)
        assert not isinstance(w.track("t"), CounterTrack)

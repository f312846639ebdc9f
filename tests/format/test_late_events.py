"""Late events held by ``TraceWriter.in_time_order`` and written on the late chain.

Each trace written here is also loaded into trace_processor by the suite's
check (tests/tp_check.py), which fails the test when trace_processor reads
other slices than :func:`tracer.format.read_trace`, or reports an error such
as ``invalid_clock_snapshots``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from trace_bytes import uncompressed
from trace_helpers import FakeClock, trace_bytes

from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.errors import InvalidArgumentError, InvalidArgumentTypeError, UnknownTrackError
from tracer.format import TraceWriter, read_trace
from tracer.format import writer as writer_module

START = 1_700_000_000_000_000_000
MS = 1_000_000
ENCODERS = ["python"] + (["c"] if writer_module._speedups is not None else [])


@pytest.fixture(params=ENCODERS)
def encoder(request: pytest.FixtureRequest) -> Iterator[str]:
    old = os.environ.get(writer_module.PURE_PYTHON_ENV)
    os.environ[writer_module.PURE_PYTHON_ENV] = "1" if request.param == "python" else "0"
    yield request.param
    if old is None:
        del os.environ[writer_module.PURE_PYTHON_ENV]
    else:
        os.environ[writer_module.PURE_PYTHON_ENV] = old


def packets(path: Path) -> list[pb.TracePacket]:
    """Every packet of the file, compressed bundles opened."""
    return list(pb.Trace.FromString(uncompressed(path.read_bytes())).packet)


def event_clocks(path: Path) -> list[int]:
    """The timestamp clock id of every track event (0: the sequence's default, 64)."""
    return [p.timestamp_clock_id for p in packets(path) if p.HasField("track_event")]


def write_run(
    path: Path, *, batched: bool, time_unit_ns: int = 1, compress: bool = False, waves: int = 40
) -> list[tuple[str, int, int]]:
    """A loop's slices now and then, and after each, two tasks' late slices and a mark,
    each task's drawn in the order of its own events (back in time from one to the
    next), as a runner draws executions when it receives them; the expected slices."""
    clock = FakeClock(START)
    w = TraceWriter(path, clock=clock, time_unit_ns=time_unit_ns, compress=compress)
    loop, worker, marks = w.track("loop"), w.track("worker"), w.track("marks")
    expected = []
    for i in range(waves):
        base = START + (i + 1) * 10 * MS
        clock.now = base + 9 * MS
        w.begin(loop, "wave", base + 5 * MS)
        w.end(loop, base + 6 * MS)
        expected.append(("wave", base + 5 * MS, MS))
        batch = w.in_time_order() if batched else _nothing()
        with batch:
            for k in (1, 0):  # the later task first
                start = base - k * 4 * MS
                w.begin(worker, "execution", start, args={"task": f"t{i}-{k}"})
                w.begin(worker, "execute", start + MS // 10)
                w.end(worker, start + 2 * MS)
                w.end(worker, start + 3 * MS)
                expected += [("execution", start, 3 * MS),
                             ("execute", start + MS // 10, 2 * MS - MS // 10)]
            w.instant(marks, "received", base - 7 * MS)
    w.close()
    return sorted(expected)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def slices(path: Path) -> list[tuple[str, int, int]]:
    return sorted((s.name, s.ts, s.dur) for s in read_trace(path).slices)


@pytest.mark.parametrize("time_unit_ns", [1, 1000])
def test_late_events_held_in_a_batch_land_at_their_times_as_deltas(
    tmp_path: Path, encoder: str, time_unit_ns: int
) -> None:
    path = tmp_path / "late.perfetto-trace"
    expected = write_run(path, batched=True, time_unit_ns=time_unit_ns)
    assert slices(path) == expected
    assert len(read_trace(path).instants) == 40
    clocks = event_clocks(path)
    # No absolute timestamp (BOOTTIME, 6) left: the late ones are on the late chain.
    assert 6 not in clocks
    assert sum(1 for c in clocks if 65 <= c <= 127) == 40 * 9
    # Each batch starts after the last one's first event: anchored once, then it goes on.
    snapshots = [p for p in packets(path) if p.HasField("clock_snapshot")]
    assert len(snapshots) == 2


def test_without_a_batch_the_same_events_are_absolute_and_larger(tmp_path: Path) -> None:
    held, loose = tmp_path / "held.perfetto-trace", tmp_path / "loose.perfetto-trace"
    assert write_run(held, batched=True) == write_run(loose, batched=False)
    assert slices(held) == slices(loose)
    assert event_clocks(loose).count(6) == 40 * 9
    assert held.stat().st_size < 0.85 * loose.stat().st_size
    held_z, loose_z = tmp_path / "held-z.perfetto-trace", tmp_path / "loose-z.perfetto-trace"
    write_run(held_z, batched=True, compress=True, time_unit_ns=1000)
    write_run(loose_z, batched=False, compress=True, time_unit_ns=1000)
    assert held_z.stat().st_size < 0.8 * loose_z.stat().st_size


def test_a_batch_earlier_than_the_last_anchor_takes_another_clock(
    tmp_path: Path, encoder: str
) -> None:
    """trace_processor rejects a snapshot whose trace clock goes back from the last
    one of the same clocks (invalid_clock_snapshots): each anchor back in time takes
    a clock of its own, and once all 63 are anchored later, events go absolute."""
    path = tmp_path / "back.perfetto-trace"
    clock = FakeClock(START + 10_000 * MS)
    w = TraceWriter(path, clock=clock)
    lane = w.track("lane")
    expected = []
    for i in range(70):  # each batch earlier than every one before it
        start = START + (5000 - 10 * i) * MS
        with w.in_time_order():
            w.begin(lane, "late", start)
            w.end(lane, start + MS)
        expected.append(("late", start, MS))
    w.close()
    assert slices(path) == sorted(expected)
    clocks = event_clocks(path)
    assert sorted(set(clocks)) == [6, *range(65, 128)]
    assert clocks.count(6) == 2 * (70 - 63)


def test_the_late_chain_goes_on_outside_a_batch_when_it_can(tmp_path: Path) -> None:
    path = tmp_path / "outside.perfetto-trace"
    clock = FakeClock(START + 100 * MS)
    w = TraceWriter(path, clock=clock)
    lane = w.track("lane")
    w.instant(lane, "now")  # the delta chain at START + 100 ms
    with w.in_time_order():
        w.instant(lane, "anchor", START + 10 * MS)  # anchors the late chain
    w.instant(lane, "later late", START + 20 * MS)  # after it: on the late chain
    w.instant(lane, "earlier late", START + 5 * MS)  # before it: absolute
    w.close()
    assert [(i.name, i.ts) for i in read_trace(path).instants] == [
        ("earlier late", START + 5 * MS), ("anchor", START + 10 * MS),
        ("later late", START + 20 * MS), ("now", START + 100 * MS),
    ]
    assert event_clocks(path) == [0, 65, 65, 6]


def test_a_batch_keeps_the_order_of_each_tracks_events(tmp_path: Path) -> None:
    """Merged by time across tracks, never reordered within one: events of one
    timestamp are read in file order, and only the producer knows how they nest."""
    path = tmp_path / "ties.perfetto-trace"
    clock = FakeClock(START + 100 * MS)
    w = TraceWriter(path, clock=clock)
    lane, other = w.track("lane"), w.track("other")
    with w.in_time_order():
        w.begin(lane, "b", START + 20 * MS)  # written first: not behind a's end
        w.begin(lane, "b.1", START + 20 * MS)
        w.end(lane, START + 30 * MS)
        w.end(lane, START + 30 * MS)
        w.begin(other, "a", START + 10 * MS)
        w.end(other, START + 20 * MS)
        w.begin(other, "c", START + 20 * MS)
        w.end(other, START + 25 * MS)
        w.instant(lane, "back", START + 5 * MS)  # behind the lane's events: kept after them
    w.close()
    got = {s.name: (s.ts, s.dur, s.depth) for s in read_trace(path).slices}
    assert got == {
        "a": (START + 10 * MS, 10 * MS, 0),
        "b": (START + 20 * MS, 10 * MS, 0),
        "b.1": (START + 20 * MS, 10 * MS, 1),
        "c": (START + 20 * MS, 5 * MS, 0),
    }
    model = read_trace(path)
    assert [(i.name, i.ts) for i in model.instants] == [("back", START + 5 * MS)]
    # a, then b's (lane's head, 20 ms, comes before other's c at 20 ms), then c, then back
    assert event_clocks(path) == [65] * 8 + [6]


def test_a_bad_timestamp_raises_at_the_call_and_nothing_is_held(tmp_path: Path) -> None:
    path = tmp_path / "bad-ts.perfetto-trace"
    w = TraceWriter(path, clock=FakeClock(START + 100 * MS))
    lane = w.track("lane")
    with w.in_time_order():
        with pytest.raises(InvalidArgumentTypeError, match="must be an int"):
            w.instant(lane, "float", float(START))
        with pytest.raises(InvalidArgumentError, match="negative"):
            w.end(lane, -1)
        w.instant(lane, "fine", START + MS)
    w.close()
    assert [i.name for i in read_trace(path).instants] == ["fine"]


def test_what_the_writer_rejects_in_a_batch_raises_at_its_end(tmp_path: Path) -> None:
    """The events before it in time are written; the ones after it are dropped."""
    path = tmp_path / "bad-track.perfetto-trace"
    w = TraceWriter(path, clock=FakeClock(START + 100 * MS))
    lane, other = w.track("lane"), w.track("other")
    with pytest.raises(UnknownTrackError), w.in_time_order():
        w.instant(lane, "after", START + 3 * MS)
        w.instant("not a track", "bad", START + 2 * MS)  # type: ignore[arg-type]
        w.instant(other, "before", START + MS)
    w.instant(lane, "unheld")  # the writer's methods are its own again
    w.close()
    assert [i.name for i in read_trace(path).instants] == ["before", "unheld"]


def test_a_block_that_raises_still_writes_what_it_held(tmp_path: Path) -> None:
    path = tmp_path / "raised.perfetto-trace"
    w = TraceWriter(path, clock=FakeClock(START + 100 * MS))
    lane = w.track("lane")
    with pytest.raises(RuntimeError, match="the producer failed"), w.in_time_order():
        w.begin(lane, "held", START + MS)
        w.end(lane, START + 2 * MS)
        raise RuntimeError("the producer failed")
    w.close()
    assert slices(path) == [("held", START + MS, MS)]


def test_nested_batches_are_written_once_by_the_outermost(tmp_path: Path) -> None:
    path = tmp_path / "nested.perfetto-trace"
    w = TraceWriter(path, clock=FakeClock(START + 100 * MS))
    tracks = [w.track(name) for name in "abc"]
    with w.in_time_order():
        w.instant(tracks[2], "c", START + 3 * MS)
        with w.in_time_order():
            w.instant(tracks[1], "b", START + 2 * MS)
        size = len(w._buf)
        w.instant(tracks[0], "a", START + MS)
        assert len(w._buf) == size  # still held
    w.close()
    assert [i.name for i in read_trace(path).instants] == ["a", "b", "c"]
    assert event_clocks(path) == [65, 65, 65]


def test_keyword_calls_and_counters_are_held_too(tmp_path: Path) -> None:
    path = tmp_path / "keywords.perfetto-trace"
    w = TraceWriter(path, clock=FakeClock(START + 100 * MS))
    lane, other, gauge = w.track("lane"), w.track("other"), w.counter_track("gauge")
    with w.in_time_order():
        w.counter(gauge, 3, START + MS)
        w.begin(track=lane, name="kw", ts=START + 2 * MS, args={"n": 1})
        w.end(lane, ts=START + 4 * MS)
        w.complete(other, "whole", START + MS, START + 2 * MS)
        w.counter(track=gauge, value=7, ts=START + 5 * MS)
    w.close()
    model = read_trace(path)
    assert sorted((s.name, s.ts, s.dur) for s in model.slices) == [
        ("kw", START + 2 * MS, 2 * MS), ("whole", START + MS, MS),
    ]
    assert [(c.ts, c.value) for c in model.counters] == [(START + MS, 3), (START + 5 * MS, 7)]


def test_a_block_holding_very_many_events_writes_them_as_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory stays bounded: past the limit, what is held is written; each track's
    order still holds, and the late chain goes on."""
    from tracer.format import _late

    monkeypatch.setattr(_late, "_MAX_HELD", 8)
    path = tmp_path / "many.perfetto-trace"
    w = TraceWriter(path, clock=FakeClock(START + 100 * MS))
    lanes = [w.track(f"lane {i}") for i in range(3)]
    expected = []
    with w.in_time_order():
        for i in range(30):
            lane = lanes[i % 3]
            start = START + i * MS
            w.begin(lane, "late", start)
            w.end(lane, start + MS // 2)
            expected.append(("late", start, MS // 2))
            assert len(w._held or ()) < 8
    w.close()
    assert slices(path) == sorted(expected)
    assert set(event_clocks(path)) == {65}


def _hand_built(late_snapshots: list[tuple[int, int]]) -> tuple[bytes, list[Any]]:
    """A delta chain on clock 64 and, between its events, snapshots that list only BOOTTIME
    and a late clock, each followed by one slice on it: (clock id, anchor in µs)."""
    t0 = 1_000_000_000  # µs
    seq = {"trusted_packet_sequence_id": 1}
    setup = pb.TracePacket(sequence_flags=1, **seq)
    setup.trace_packet_defaults.timestamp_clock_id = 64
    for clock_id, value, incremental, unit in ((6, t0 * 1000, False, 0), (64, t0, True, 1000)):
        setup.clock_snapshot.clocks.add(clock_id=clock_id, timestamp=value,
                                        is_incremental=incremental, unit_multiplier_ns=unit)
    out = [setup]
    for uuid, name in ((10, "main"), (11, "late")):
        td = pb.TracePacket(**seq)
        td.track_descriptor.uuid = uuid
        td.track_descriptor.name = name
        out.append(td)

    def event(track: int, kind: int, name: str | None, ts: int, clock: int = 0) -> None:
        p = pb.TracePacket(timestamp=ts, **seq)
        if clock:
            p.timestamp_clock_id = clock
        p.track_event.track_uuid = track
        p.track_event.type = kind
        if name:
            p.track_event.name = name
        out.append(p)

    expected = []
    head = 0
    for i, (clock_id, at) in enumerate(late_snapshots):
        snap = pb.TracePacket(**seq)
        snap.clock_snapshot.clocks.add(clock_id=6, timestamp=(t0 + at) * 1000)
        snap.clock_snapshot.clocks.add(clock_id=clock_id, timestamp=t0 + at,
                                       is_incremental=True, unit_multiplier_ns=1000)
        out.append(snap)
        event(11, 1, f"late{i}", 0, clock_id)
        event(11, 2, None, 5, clock_id)
        event(10, 1, f"main{i}", 100)  # the delta chain goes on from where it was
        event(10, 2, None, 10)
        head += 110
        expected += [(f"late{i}", (t0 + at) * 1000, 5000),
                     (f"main{i}", (t0 + head - 10) * 1000, 10_000)]
    return trace_bytes(*out), sorted(expected)


def test_the_reader_keeps_a_clock_that_a_later_snapshot_does_not_list(tmp_path: Path) -> None:
    """As trace_processor does (the suite's check compares the two on this file)."""
    data, expected = _hand_built([(65, 20), (66, 10), (65, 30), (67, 3)])
    path = tmp_path / "hand.perfetto-trace"
    path.write_bytes(data)
    model = read_trace(path)
    assert not model.problems
    assert sorted((s.name, s.ts, s.dur) for s in model.slices) == expected


@pytest.mark.skipif(writer_module._speedups is None, reason="the C encoder is not built")
def test_the_c_encoder_holds_the_calls_itself_out_of_the_cycle_collectors_sight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the C encoder the writer's methods stay the encoder's (no Python stand-ins:
    ~4x cheaper a call), and what it holds is untracked by the cycle collector: held
    calls live until the block ends, long enough to reach the oldest generation, whose
    collections walk the whole heap."""
    import gc

    monkeypatch.delenv(writer_module.PURE_PYTHON_ENV, raising=False)
    path = tmp_path / "c-held.perfetto-trace"
    w = TraceWriter(path, clock=FakeClock(START + 100 * MS))
    assert w._encoder is not None
    lane = w.track("lane")
    with w.in_time_order():
        w.begin(lane, "held", START + 2 * MS, args={"n": 1})
        w.end(lane, START + 3 * MS)
        w.instant(lane, "earlier", START + MS, category="c")
        assert w.__dict__["begin"].__self__ is w._encoder
        held = w._held
        assert held is not None and len(held) == 3
        assert not any(gc.is_tracked(call) for call in held)
        assert not any(gc.is_tracked(call[3]) for call in held)  # their arguments
        w.instant(lane, "now")  # no timestamp: the Python holder takes it, in the same list
        assert len(held) == 4
    w.close()
    model = read_trace(path)
    assert slices(path) == [("held", START + 2 * MS, MS)]
    assert [i.name for i in model.instants] == ["earlier", "now"]


def test_a_call_the_holders_write_at_once_is_not_held_again(
    tmp_path: Path, encoder: str
) -> None:
    """A call on an unhashable track is written at once, and the writer says what is wrong;
    with a timestamp the C encoder hands to the Python holders (negative, or none), the
    holders' own call must not come back to be held (it recursed without end)."""
    w = TraceWriter(tmp_path / "unhashable.perfetto-trace", clock=FakeClock(START + MS))
    lane = w.track("lane")
    with w.in_time_order():
        for ts in (-5, None, START):
            with pytest.raises(TypeError, match="unhashable"):
                w.begin([1], "x", ts)  # type: ignore[arg-type]
        w.instant(lane, "held", START)
    w.close()
    assert [i.name for i in read_trace(tmp_path / "unhashable.perfetto-trace").instants] == [
        "held"
    ]


@pytest.mark.unchecked_traces("a timestamp past int64, which trace_processor rejects on purpose")
def test_a_track_keyed_by_a_timestamp_past_a_long_long_is_held_in_order(
    tmp_path: Path, encoder: str
) -> None:
    """A timestamp past 2**63 ns (the C encoder hands it to the Python holders) keys its
    track; the C encoder's next call on that track does not overflow reading that key."""
    w = TraceWriter(tmp_path / "huge.perfetto-trace", clock=FakeClock(START + MS))
    gauge = w.counter_track("gauge")
    huge = 2**63 + 5
    with w.in_time_order():
        w.counter(gauge, 1, huge)
        w.counter(gauge, 2, START)
    w.close()
    model = read_trace(tmp_path / "huge.perfetto-trace")
    # (Past int64 the reader, as trace_processor, has no time for the first.)
    assert [(c.ts, c.value) for c in model.counters if c.value == 2] == [(START, 2)]


def test_a_keyword_given_twice_raises_at_the_call_as_python_does(
    tmp_path: Path, encoder: str
) -> None:
    w = TraceWriter(tmp_path / "twice.perfetto-trace", clock=FakeClock(START + MS))
    lane = w.track("lane")
    with w.in_time_order():
        with pytest.raises(TypeError, match="multiple values"):
            w.begin(lane, "x", START, ts=START)  # type: ignore[misc]
        w.instant(lane, "held", START)
    w.close()
    assert [i.name for i in read_trace(tmp_path / "twice.perfetto-trace").instants] == ["held"]

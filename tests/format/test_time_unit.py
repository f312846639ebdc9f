"""``TraceWriter(time_unit_ns=...)``: timestamps recorded at a coarser resolution.

Timestamps still go in and come out in ns; the trace's incremental clock counts
in units (``unit_multiplier_ns``), so deltas take fewer bytes.
"""

from __future__ import annotations

import inspect
import random
from pathlib import Path
from typing import Any

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as perfetto_pb2
from trace_helpers import FakeClock, content

from tracer.errors import InvalidArgumentError, TracerError
from tracer.format import TraceWriter, read_trace

START = 1_700_000_000_123_456_789


def _script(w: TraceWriter, stamps: list[int]) -> None:
    """The same events at the given timestamps (ns): nesting, args, flows, a late
    event, a whole slice, counters, and events timed by the writer's clock."""
    loop = w.thread_track(10, 11, "loop")
    lane = w.track("lane")
    memory = w.counter_track("memory", unit="bytes")
    share = w.counter_track("share")
    flow = w.new_flow_id()
    t = iter(stamps)
    w.begin(loop, "wave", next(t), args={"wave": 1})
    w.begin(loop, "poll", next(t), category="scheduler")
    w.end(loop, next(t))
    w.counter(memory, 1 << 30, next(t))
    w.counter(share, 0.25, next(t))
    w.begin(lane, "task", next(t), args={"task_id": "a"}, flows=[flow])
    w.instant(loop, "late", next(t))  # earlier than the previous event
    w.complete(lane, "io", next(t), next(t), args={"n": 3})
    w.end(lane, next(t))
    w.instant(loop, "tick", next(t), terminating_flows=[flow])
    w.end(loop, next(t))
    w.begin(loop, "clocked")  # timed by the writer's clock
    w.end(loop)


def _stamps(unit: int) -> list[int]:
    """Increasing timestamps in whole units, except the late one (7th)."""
    gaps = [3, 70, 200, 20_000, 1, 5_000, 0, 9, 4, 2_500_000, 11, 6]
    out, ts = [], START - START % unit
    for gap in gaps:
        ts += gap * unit
        out.append(ts)
    out[6] = out[1] - unit  # late: before the poll began
    return out


def _model_dict(path: Path) -> dict[str, Any]:
    return content(read_trace(path, strict=True))


@pytest.mark.parametrize("unit", [1000, 64, 1_000_000])
def test_timestamps_on_the_unit_read_back_exactly(tmp_path: Path, unit: int) -> None:
    """Timestamps that are whole units lose nothing: the same trace as in ns."""
    stamps = _stamps(unit)
    clock_start = START - START % unit
    coarse, fine = tmp_path / "coarse.pftrace", tmp_path / "fine.pftrace"
    for path, u in ((coarse, unit), (fine, 1)):
        with TraceWriter(path, clock=FakeClock(clock_start, step=unit), time_unit_ns=u) as w:
            assert w.time_unit_ns == u
            assert w.start_ts == clock_start
            _script(w, stamps)
    assert _model_dict(coarse) == _model_dict(fine)
    slices = {s.name: s for s in read_trace(coarse, strict=True).slices}
    assert slices["io"].ts == stamps[7] and slices["io"].dur == stamps[8] - stamps[7]
    assert slices["poll"].category == "scheduler"
    assert coarse.stat().st_size < fine.stat().st_size


def test_timestamps_are_rounded_down_to_the_unit(tmp_path: Path) -> None:
    path = tmp_path / "t.pftrace"
    clock = FakeClock(START, step=1234)
    with TraceWriter(path, clock=clock, time_unit_ns=1000) as w:
        assert w.start_ts == START - START % 1000
        assert w.now() % 1000 == 0 and w.now() <= clock.now
        track = w.thread_track(1, 2, "t")
        counter = w.counter_track("c")
        w.begin(track, "a", START + 1999)
        w.instant(track, "late", START + 1500, args={"k": 1})
        w.counter(counter, 7, START + 2001)
        w.end(track, START + 2999)
    model = read_trace(path, strict=True)
    (a,) = model.slices
    assert a.ts == (START + 1999) // 1000 * 1000
    assert a.ts + a.dur == (START + 2999) // 1000 * 1000
    assert [i.ts for i in model.instants] == [(START + 1500) // 1000 * 1000]
    assert [c.ts for c in model.counters] == [(START + 2001) // 1000 * 1000]


def test_perfettos_schema_sees_an_incremental_clock_in_units(tmp_path: Path) -> None:
    """Decoded with the perfetto package's own pb2: clock 64 counts in units and
    each delta is in units; a late event is absolute BOOTTIME ns, rounded down."""
    path = tmp_path / "t.pftrace"
    start = START - START % 1000
    with TraceWriter(path, clock=FakeClock(start), time_unit_ns=1000) as w:
        track = w.thread_track(1, 2, "t")
        w.begin(track, "a", start + 5_000)
        w.end(track, start + 5_000 + 300_000)
        w.instant(track, "late", start + 4_321)
    trace = perfetto_pb2.Trace()
    trace.ParseFromString(path.read_bytes())
    clocks = {c.clock_id: c for c in trace.packet[0].clock_snapshot.clocks}
    assert clocks[6].timestamp == start
    assert clocks[64].timestamp == start // 1000
    assert clocks[64].is_incremental and clocks[64].unit_multiplier_ns == 1000
    events = [p for p in trace.packet if p.HasField("track_event")]
    assert [(p.timestamp, p.timestamp_clock_id) for p in events] == [
        (5, 0), (300, 0), (start + 4_000, 6)
    ]


@pytest.mark.parametrize("bad", [0, -1000, 1.5, True, "1000", None, 10**9 + 1])
def test_a_bad_unit_is_refused_before_any_file_is_made(tmp_path: Path, bad: object) -> None:
    path = tmp_path / "t.pftrace"
    with pytest.raises(InvalidArgumentError, match="time_unit_ns") as info:
        TraceWriter(path, time_unit_ns=bad)  # type: ignore[arg-type]
    assert isinstance(info.value, TracerError)
    assert not path.exists()


def test_microseconds_make_a_long_stream_smaller(tmp_path: Path) -> None:
    """The point of the option: gaps of 1 us - 2 ms cost 1-2 bytes instead of 2-3."""
    rng = random.Random(3)
    sizes = {}
    for unit, compress in ((1, False), (1000, False), (1, True), (1000, True)):
        path = tmp_path / f"{unit}-{compress}.pftrace"
        ts = START
        with TraceWriter(path, clock=FakeClock(START), time_unit_ns=unit,
                         compress=compress) as w:
            tracks = [w.thread_track(1, 2 + i, f"w{i}") for i in range(8)]
            for _ in range(5000):
                track = rng.choice(tracks)
                ts += rng.randrange(1_000, 2_000_000)
                w.begin(track, rng.choice(["a", "b", "c"]), ts)
                ts += rng.randrange(1_000, 2_000_000)
                w.end(track, ts)
        sizes[unit, compress] = path.stat().st_size
        assert len(read_trace(path, strict=True).slices) == 5000
    assert sizes[1000, False] < 0.95 * sizes[1, False]
    assert sizes[1000, True] < 0.85 * sizes[1, True]


def test_a_subclass_of_the_writer_takes_the_unit_too(tmp_path: Path) -> None:
    begins = []

    class Counting(TraceWriter):
        def begin(self, *args: Any, **kwargs: Any) -> None:
            begins.append(args)
            super().begin(*args, **kwargs)

    path = tmp_path / "t.pftrace"
    start = START - START % 1000
    with Counting(path, clock=FakeClock(start), time_unit_ns=1000) as w:
        assert isinstance(w, Counting) and w.time_unit_ns == 1000
        track = w.thread_track(1, 2, "t")
        w.begin(track, "a", start + 5_999)
        w.end(track, start + 9_000)
    (a,) = read_trace(path, strict=True).slices
    assert (a.ts, a.dur) == (start + 5_000, 4_000)
    assert [args[2] for args in begins] == [start + 5_999]  # the override sees ns
    with Counting(tmp_path / "again.pftrace", time_unit_ns=1000) as again:
        assert type(again) is type(w)  # the combined class is made once


def test_the_constructor_keeps_its_signature() -> None:
    """Help and IDEs show the real parameters, not ``*args, **kwargs``."""
    parameters = inspect.signature(TraceWriter).parameters
    assert "time_unit_ns" in parameters and "compress" in parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in parameters.values())

"""The writer's own clock never goes back: a wall clock stepped back breaks no slice.

NTP correcting the wall clock, or a VM resumed, can step ``time.time_ns``
back. Events the writer times itself would then go back too: a slice begun
before the step would end before it began, trace_processor would match that
END to nothing and leave the BEGIN open, and every later slice of its track
would nest in it. The writer holds its reading where it was until the clock
catches up, in C (which reads the wall clock itself) as in Python.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from trace_helpers import FakeClock

from tracer.format import TraceWriter, read_trace
from tracer.format import writer as writer_module

START = 1_700_000_000_000_000_000
MS = 1_000_000


def _writer(path: Path, pure: bool, clock: FakeClock, unit: int) -> TraceWriter:
    old = os.environ.get(writer_module.PURE_PYTHON_ENV)
    os.environ[writer_module.PURE_PYTHON_ENV] = "1" if pure else "0"
    try:
        return TraceWriter(path, clock=clock, time_unit_ns=unit, compress=True)
    finally:
        if old is None:
            del os.environ[writer_module.PURE_PYTHON_ENV]
        else:
            os.environ[writer_module.PURE_PYTHON_ENV] = old


@pytest.mark.parametrize("unit", [1, 1000])
@pytest.mark.parametrize("pure", [True, False], ids=["python", "c"])
def test_a_clock_stepped_back_holds_until_it_catches_up(
    tmp_path: Path, pure: bool, unit: int
) -> None:
    if not pure and not writer_module.use_speedups():
        pytest.skip("the C encoder is not in use here")
    clock = FakeClock(START)
    path = tmp_path / "stepped.perfetto-trace"
    w = _writer(path, pure, clock, unit)
    loop = w.thread_track(1, 1, "loop")
    clock.now = START + 10 * MS
    w.begin(loop, "wave")
    w.begin(loop, "poll")
    clock.now = START + 2 * MS  # stepped back by 8 ms
    w.end(loop)  # held at 10 ms: the poll lasts nothing, and nests
    assert w.now() == START + 10 * MS
    w.instant(loop, "given", START + 3 * MS)  # a timestamp given is written as given
    clock.now = START + 6 * MS
    w.begin(loop, "dispatch")
    clock.now = START + 14 * MS  # caught up
    w.end(loop)
    assert w.now() == START + 14 * MS
    clock.now = START + 15 * MS
    w.end(loop)
    w.begin(loop, "next wave")
    clock.now = START + 16 * MS
    w.end(loop)
    w.close()

    model = read_trace(path, strict=True)
    slices = sorted(((s.name, s.ts - START, s.dur, s.depth) for s in model.slices),
                    key=lambda s: (s[1], s[3]))
    assert slices == [
        ("wave", 10 * MS, 5 * MS, 0),
        ("poll", 10 * MS, 0, 1),
        ("dispatch", 10 * MS, 4 * MS, 1),
        ("next wave", 15 * MS, 1 * MS, 0),
    ]
    (given,) = model.instants
    assert given.ts == START + 3 * MS


def test_the_wall_clock_read_in_c_never_goes_back(tmp_path: Path) -> None:
    """C reads CLOCK_REALTIME itself: its readings are held at the latest the same way,
    and ``now()`` is that same reading (so a runner's own timestamps agree with it)."""
    from tracer.format import _speedups

    if not writer_module.use_speedups() or _speedups is None:
        pytest.skip("the C encoder is not in use here")
    with TraceWriter(tmp_path / "wall.perfetto-trace", time_unit_ns=1000) as w:
        assert w._encoder is not None and w._clock == w._encoder.clock
        readings = [w.now() for _ in range(1000)]
        assert readings == sorted(readings)
    with TraceWriter(tmp_path / "ahead.perfetto-trace", time_unit_ns=1000) as other:
        # An encoder whose latest reading is 50 ms ahead of the wall clock (it starts
        # from its writer's start): what a reading after a step back of 50 ms looks like.
        ahead = time.time_ns() // 1000 + 50_000
        other._last = ahead
        encoder = _speedups.Encoder(other, realtime_clock=True)
        assert encoder.clock() == ahead
        assert encoder.clock() == ahead
        time.sleep(0.08)
        assert encoder.clock() > ahead  # caught up: it moves again
        assert time.time_ns() // 1000 - encoder.clock() < 1_000_000

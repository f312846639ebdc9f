"""Events with args whose head was written before take the writer's fast path.

The fast path (``TraceWriter._fast_event``) encodes only the args, reusing
the event's head (type, track, name, category); anything it does not handle
goes back to the slow path. These tests write streams where both paths
alternate on the same heads and decode them with the perfetto package's own
schema and with our reader: every event must carry exactly its args, every
interned string must be defined once and before use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_writer_perfetto_decode import Interned, _inflated, decode, events
from trace_helpers import FakeClock

from tracer.format import TraceWriter, read_trace
from tracer.format import writer as writer_module

T0 = 5_000_000_000

# Args that repeat a head with every kind of value the fast path encodes, and
# some it hands back (nested values, new names, huge ints).
ARGS: list[dict[str, Any]] = [
    {"task_id": "0-1", "n": 0, "big": 2**40, "neg": -5, "f": 0.5, "ok": True},
    {"task_id": "0-1", "n": 16383, "big": 2**63 - 1, "neg": -(2**63), "f": -1.25, "ok": False},
    {"task_id": "0-1", "n": 16384, "big": 1, "neg": -1, "f": 1e300, "ok": True},
    {"task_id": "0-2", "n": 1, "req": {"num_cpus": 1.0}},
    {"task_id": "0-2", "n": 2, "req": {"num_cpus": 1.0}},  # a cached flat dict
    {"task_id": "0-2", "n": 3, "nested": {"a": [1, 2, {"b": "x"}]}},  # slow path
    {"task_id": "0-3", "fresh_name": 7},  # a new arg name: slow path
    {"task_id": "0-3", "fresh_name": 8},
    {"task_id": "0-3", "huge": 2**64 - 1},  # beyond int64: slow path (uint)
    {"task_id": "0-3", "s": "é" * 3, "empty": ""},
]


def _write(path: Path, compress: bool = False) -> list[dict[str, Any]]:
    written = []
    with TraceWriter(path, clock=FakeClock(T0), compress=compress) as w:
        t = w.track("lane")
        for i, args in enumerate(ARGS * 3):
            w.begin(t, "task", T0 + 10 * i, category="task", args=args)
            w.end(t, T0 + 10 * i + 5, args={"status": "done", "i": i})
            written.append(args)
    return written


@pytest.mark.parametrize("compress", [False, True])
def test_fast_and_slow_events_decode_with_perfettos_schema(tmp_path: Path, compress: bool) -> None:
    path = tmp_path / "t.perfetto-trace"
    written = _write(path, compress)
    packets = _inflated(path) if compress else decode(path)
    interned = Interned(packets)  # asserts no iid is redefined differently
    evs = events(packets)
    begins = [e for e in evs if e.track_event.type == 1]
    ends = [e for e in evs if e.track_event.type == 2]
    assert [interned.args(e.track_event) for e in begins] == written
    assert [interned.args(e.track_event) for e in ends] == [
        {"status": "done", "i": i} for i in range(len(written))
    ]
    # A value used three times or more is interned, once.
    definitions = [
        s.str for p in packets for s in p.interned_data.debug_annotation_string_values
    ]
    assert definitions.count(b"0-1") == 1
    assert definitions.count(b"done") == 1


def test_fast_path_is_taken_and_reader_sees_no_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(writer_module.PURE_PYTHON_ENV, "1")  # Python's own fast path
    taken = []
    fast = writer_module.TraceWriter._fast_event

    def counting(self: TraceWriter, *a: Any) -> bool:
        ok = fast(self, *a)
        taken.append(ok)
        return ok

    monkeypatch.setattr(writer_module.TraceWriter, "_fast_event", counting)
    path = tmp_path / "t.perfetto-trace"
    written = _write(path)
    # Both paths ran: most repeats are fast, nested/new/huge args are not.
    assert taken.count(True) > len(written)
    assert taken.count(False) >= 3
    _check_read_back(path, written)


@pytest.mark.skipif(writer_module._speedups is None, reason="the C encoder was not built")
def test_the_c_encoder_takes_the_fast_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(writer_module.PURE_PYTHON_ENV, raising=False)
    encoders = []
    make = writer_module.TraceWriter._accelerate

    def keep(self: TraceWriter, realtime_clock: bool) -> None:
        make(self, realtime_clock)
        encoders.append(self._encoder)

    monkeypatch.setattr(writer_module.TraceWriter, "_accelerate", keep)
    path = tmp_path / "t.perfetto-trace"
    written = _write(path)
    (encoder,) = encoders
    stats = encoder.stats()
    assert stats["args"] > len(written)  # most repeats: in C
    assert stats["python"] >= 3  # nested, new and huge args: Python's slow path
    _check_read_back(path, written)


def _check_read_back(path: Path, written: list[dict[str, Any]]) -> None:
    model = read_trace(path, strict=True)
    assert not model.problems
    slices = sorted(model.slices, key=lambda s: s.ts)
    assert [s.args for s in slices] == [
        {**a, "status": "done", "i": i} for i, a in enumerate(written)
    ]


def test_fast_event_that_gives_up_forgets_what_it_interned(tmp_path: Path) -> None:
    """A value interned by a fast event that then falls back is defined by the slow path."""
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        t = w.track("lane")
        w.instant(t, "e", T0 + 1, args={"s": "v", "k": 1})
        w.instant(t, "e", T0 + 2, args={"s": "v", "k": 2})
        # "v" is interned here, then "new" sends the event to the slow path.
        w.instant(t, "e", T0 + 3, args={"s": "v", "new": 3})
        w.instant(t, "e", T0 + 4, args={"s": "v", "k": 4})
        assert w._string_values == {"v": 1}
    packets = decode(path)
    interned = Interned(packets)
    evs = events(packets)
    assert [interned.args(e.track_event) for e in evs] == [
        {"s": "v", "k": 1}, {"s": "v", "k": 2}, {"s": "v", "new": 3}, {"s": "v", "k": 4},
    ]
    defs = [[s.iid for s in e.interned_data.debug_annotation_string_values] for e in evs]
    assert defs == [[], [], [1], []]
    assert read_trace(path, strict=True).problems == []


def test_fast_path_validates_flows_like_the_slow_path(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        t = w.track("lane")
        w.begin(t, "e", T0 + 1, args={"k": 1}, flows=[1])
        w.end(t, T0 + 2)
        with pytest.raises(writer_module.InvalidArgumentError):
            w.begin(t, "e", T0 + 3, args={"k": 2}, flows=[0])
        w.begin(t, "e", T0 + 4, args={"k": 3}, terminating_flows=[1])
        w.end(t, T0 + 5)
    model = read_trace(path, strict=True)
    assert [s.args for s in model.slices] == [{"k": 1}, {"k": 3}]
    assert len(model.flows) == 1


"""A trace cut anywhere (a crash mid-write) still reads, up to its last complete packet.

Uncompressed, the cut loses only the packet it falls in; compressed, the
bundle it falls in. The model of a cut file must be exactly the model of the
file's complete records before the cut.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trace_helpers import FakeClock, content, record_ends

from tracer.errors import TraceReadError
from tracer.format import TraceWriter, read_trace

T0 = 1_000_000_000


def write_small_trace(path: Path, *, compress: bool, buffer_size: int = 1024) -> None:
    with TraceWriter(path, clock=FakeClock(T0), compress=compress, buffer_size=buffer_size) as w:
        proc = w.process_track(7, "node")
        loop = w.thread_track(7, 8, "loop")
        lane = w.track("lane", parent=proc)
        memory = w.counter_track("memory", unit="bytes", unit_multiplier=1024)
        for i in range(12):
            t = T0 + 1000 * i
            w.begin(loop, "wave", t, args={"wave": i, "tag": "w"} if i % 3 == 0 else None)
            flow = w.new_flow_id()
            w.begin(lane, "task", t + 100, category="task", flows=[flow])
            w.counter(memory, i * 7, t + 150)
            w.instant(loop, "dispatched", t + 200, terminating_flows=[flow])
            w.end(lane, t + 400, args={"ok": True})
            w.end(loop, t + 900)
        w.complete(lane, "late", T0 + 50, T0 + 60)


def empty_model_content() -> dict[str, object]:
    return {"tracks": {}, "slices": [], "instants": [], "counters": [], "flows": [],
            "process_ordering": None, "thread_ordering": None}


def test_uncompressed_trace_cut_at_every_byte(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    write_small_trace(path, compress=False)
    data = path.read_bytes()
    ends = record_ends(data)
    assert ends[-1] == len(data) and len(ends) > 60
    full = read_trace(data, strict=True)
    assert len(full.slices) == 25 and len(full.flows) == 12
    prefixes: dict[int, dict[str, object]] = {0: empty_model_content()}
    for k, end in enumerate(ends, start=1):
        model = read_trace(data[:end])
        assert not model.truncated and model.packet_count == k
        prefixes[k] = content(model)
    boundaries = set(ends)
    with pytest.raises(TraceReadError, match="empty file"):
        read_trace(data[:0])
    for cut in range(1, len(data) + 1):
        model = read_trace(data[:cut])
        complete = sum(1 for end in ends if end <= cut)
        assert model.truncated == (cut not in boundaries), cut
        assert model.packet_count == complete, cut
        assert content(model) == prefixes[complete], cut
    # The cuts do change what is read: every packet after the setup packet adds something.
    assert len({repr(c) for k, c in prefixes.items() if k >= 1}) == len(prefixes) - 1


def test_compressed_trace_cut_anywhere_reads_up_to_its_last_complete_bundle(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.perfetto-trace"
    write_small_trace(path, compress=True)
    data = path.read_bytes()
    bundle_ends = record_ends(data)
    assert len(bundle_ends) >= 2, "the test needs several bundles"
    prefixes: dict[int, dict[str, object]] = {0: empty_model_content()}
    counts = {0: 0}
    for k, end in enumerate(bundle_ends, start=1):
        model = read_trace(data[:end])
        assert not model.truncated
        assert {p.kind for p in model.problems} <= {"unterminated_slice"}
        prefixes[k] = content(model)
        counts[k] = model.packet_count
    assert content(read_trace(data)) == prefixes[len(bundle_ends)]
    boundaries = set(bundle_ends)
    for cut in range(1, len(data) + 1):
        model = read_trace(data[:cut])
        complete = sum(1 for end in bundle_ends if end <= cut)
        assert model.truncated == (cut not in boundaries), cut
        assert model.packet_count == counts[complete], cut
        assert content(model) == prefixes[complete], cut


def test_cut_three_bytes_short_leaves_the_last_slice_open(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        lane = w.track("lane")
        w.begin(lane, "a", T0 + 10)
        w.end(lane, T0 + 20)
        w.begin(lane, "b", T0 + 30)
        w.end(lane, T0 + 40)
    data = path.read_bytes()
    model = read_trace(data[:-3])
    assert model.truncated
    assert [(s.name, s.dur) for s in model.slices] == [("a", 10), ("b", None)]
    assert [p.kind for p in model.problems] == ["unterminated_slice"]
    # Truncation alone is not a problem: strict mode accepts a cut that leaves nothing open.
    with pytest.raises(TraceReadError, match="unterminated_slice"):
        read_trace(data[:-3], strict=True)
    cut_after_end = read_trace(data[: record_ends(data)[-3] + 2], strict=True)
    assert cut_after_end.truncated and [s.dur for s in cut_after_end.slices] == [10]


@pytest.mark.parametrize("compress", [False, True])
def test_a_trace_being_written_reads_after_each_flush(tmp_path: Path, compress: bool) -> None:
    """What a reader (or a crash) sees on disk mid-run is always a valid trace."""
    path = tmp_path / "t.perfetto-trace"
    w = TraceWriter(path, clock=FakeClock(T0), compress=compress)
    lane = w.track("lane")
    for i in range(5):
        w.begin(lane, "step", T0 + 100 * i)
        w.flush()
        model = read_trace(path)
        assert not model.truncated
        assert [s.dur for s in model.slices] == [50] * i + [None]
        w.end(lane, T0 + 100 * i + 50)
    w.close()
    assert [s.dur for s in read_trace(path, strict=True).slices] == [50] * 5

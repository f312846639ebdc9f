"""Compressed traces stay durable at every flush and end up as big bundles.

With ``compress=True``, ``flush()`` appends the buffered packets raw (so they
are on disk at once) and a later bundle is written over them. The file must
be a valid trace after every flush and after every bundle, and the padding
used while a bundle replaces the raw tail must be skipped by readers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as perfetto_pb2

from tracer.format import TraceWriter, read_trace
from tracer.format._output import _padding


def _events(writer: TraceWriter, track: object, start: int, count: int) -> int:
    ts = start
    for i in range(count):
        ts += 1500
        writer.begin(track, f"step {i % 7}", ts, category="test")  # type: ignore[arg-type]
        ts += 900
        writer.end(track, ts)  # type: ignore[arg-type]
    return ts


def test_every_flush_is_durable_and_the_file_ends_as_bundles(tmp_path: Path) -> None:
    path = tmp_path / "c.perfetto-trace"
    raw_path = tmp_path / "r.perfetto-trace"
    w = TraceWriter(path, compress=True, buffer_size=16 * 1024, clock=lambda: 10**9)
    raw = TraceWriter(raw_path, compress=False, clock=lambda: 10**9)
    t = w.thread_track(1, 1, "loop")
    rt = raw.thread_track(1, 1, "loop")
    ts = 10**9
    for flush_no in range(1, 120):
        _events(raw, rt, ts, 20)
        ts = _events(w, t, ts, 20)
        w.flush()
        # On disk now: every slice so far, a valid trace with no problems.
        model = read_trace(path)
        assert not model.problems, model.problems
        assert len(model.slices) == 20 * flush_no
        assert all(s.dur is not None for s in model.slices)
    w.close()
    raw.close()
    final = read_trace(path)
    assert not final.problems
    assert [(s.name, s.ts, s.dur) for s in final.slices] == [
        (s.name, s.ts, s.dur) for s in read_trace(raw_path).slices
    ]
    data = path.read_bytes()
    outer = perfetto_pb2.Trace.FromString(data).packet
    bundles = [p for p in outer if p.HasField("compressed_packets")]
    assert len(bundles) >= 2
    assert all(not p.HasField("track_event") for p in outer), "raw events left outside bundles"
    # Big bundles compress far better than one bundle per flush would.
    assert len(data) < 0.35 * raw_path.stat().st_size


@pytest.mark.parametrize("size", [*range(0, 300), 16383, 16384, 16385, 16386, 16387, 262147])
def test_padding_has_the_exact_size_and_is_skipped_by_readers(size: int) -> None:
    pad = _padding(size)
    assert len(pad) == size
    complete = pad[:-1] if pad.endswith(b"\x0a") and not pad.endswith(b"\x0a\x00") else pad
    packets = perfetto_pb2.Trace.FromString(complete).packet
    assert all(p.ListFields() == [] for p in packets)


def test_padding_after_a_bundle_reads_as_nothing(tmp_path: Path) -> None:
    """What a kill between the bundle's pwrite and the ftruncate would leave."""
    path = tmp_path / "p.perfetto-trace"
    with TraceWriter(path, compress=True, clock=lambda: 10**9) as w:
        t = w.thread_track(1, 1, "loop")
        _events(w, t, 10**9, 50)
    whole = read_trace(path)
    for size in (1, 2, 3, 130, 5000):
        padded = tmp_path / f"padded-{size}"
        padded.write_bytes(path.read_bytes() + _padding(size))
        model = read_trace(padded)
        assert [(s.name, s.ts, s.dur) for s in model.slices] == [
            (s.name, s.ts, s.dur) for s in whole.slices
        ]
        assert not [p for p in model.problems if "unknown" not in str(p)]


def test_cached_encodings_keep_values_apart(tmp_path: Path) -> None:
    """Encoded args and events are reused for equal values: equal is not enough
    (True == 1, 0.0 == -0.0), the reader must get back exactly what was written."""
    import math

    path = tmp_path / "cache.perfetto-trace"
    values = [1, True, 1.0, 0.0, -0.0, 0, False, "1", 0.0, -0.0, True, 1]
    with TraceWriter(path, clock=lambda: 10**9) as w:
        t = w.thread_track(1, 1, "loop")
        ts = 10**9
        for _ in range(2):  # the second round is served from the caches
            for v in values:
                ts += 10
                w.begin(t, "s", ts, args={"v": v, "d": {"v": v}})
                ts += 10
                w.end(t, ts, args={"e": v})
    slices = read_trace(path).slices
    assert len(slices) == 2 * len(values)
    for s, v in zip(slices, values * 2, strict=True):
        for got in (s.args["v"], s.args["d"]["v"], s.args["e"]):
            assert type(got) is type(v) and got == v
            if isinstance(v, float):
                assert math.copysign(1, got) == math.copysign(1, v)

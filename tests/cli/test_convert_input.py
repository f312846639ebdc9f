"""``tracer convert``'s inputs: gzip-compressed timelines, and inputs it cannot convert
(empty, a Perfetto trace already, missing) refused first, each with its own reason."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from test_cli import assert_one_line_error, tracer
from test_convert import _peak_rss

from tracer.format import TraceWriter, read_trace


def _events(tasks: int, workers: int = 4, start: float = 0.0) -> list[dict[str, Any]]:
    """A Ray-like timeline: each task's phases, then its own slice, on its worker."""
    out: list[dict[str, Any]] = []
    for i in range(tasks):
        ts = start + i * 100.0
        common = {"pid": "10.0.0.1", "tid": f"worker:{i % workers:08x}abcdef"}
        task_id = f"{i:032x}"
        for n, cat in enumerate(("deserialize_arguments", "execute", "store_outputs")):
            out.append({"cat": f"task:{cat}", "name": f"task:{cat}", "ph": "X",
                        "ts": ts + 1 + n * 30, "dur": 25.0, "args": {"task_id": task_id},
                        **common})
        out.append({"cat": "task::square", "name": "square", "ph": "X", "ts": ts,
                    "dur": 95.0, "args": {"task_id": task_id, "name": "square"}, **common})
    return out


def _slices(trace: Path) -> list[tuple[str, int, int | None]]:
    model = read_trace(trace, strict=True)
    assert not model.problems
    return sorted((s.name, s.ts, s.dur) for s in model.slices)


def test_a_gzipped_timeline_converts_as_the_plain_one(tmp_path: Path) -> None:
    text = json.dumps(_events(50))
    plain = tmp_path / "plain.json"
    plain.write_text(text)
    packed = tmp_path / "timeline.json.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    result = tracer("convert", plain)
    assert result.returncode == 0, result.stderr
    # The default name drops .gz too: timeline.perfetto-trace, beside it.
    result = tracer("convert", packed)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = tmp_path / "timeline.perfetto-trace"
    assert result.stdout.startswith(f"{out}: 50 task(s), 200 slice(s)"), result.stdout
    expected = _slices(tmp_path / "plain.perfetto-trace")
    assert len(expected) == 200
    assert _slices(out) == expected
    # Told by its bytes, not its name; gzip's several members (files cat'ed) are one text.
    half = len(text) // 2
    odd = tmp_path / "timeline.data"
    odd.write_bytes(gzip.compress(text[:half].encode()) + gzip.compress(text[half:].encode()))
    result = tracer("convert", odd, "-o", tmp_path / "odd.perfetto-trace")
    assert result.returncode == 0, result.stderr
    assert _slices(tmp_path / "odd.perfetto-trace") == expected


def test_a_cut_or_damaged_gzip_is_one_error_line(tmp_path: Path) -> None:
    data = gzip.compress(json.dumps(_events(200)).encode())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    assert_one_line_error(tracer("convert", cut), f"{cut}: the gzip file is cut short")
    damaged = tmp_path / "damaged.json.gz"
    damaged.write_bytes(data[:20] + bytes(64) + data[84:])
    assert_one_line_error(tracer("convert", damaged),
                          f"{damaged}: its gzip compression is damaged")
    assert not (tmp_path / "cut.perfetto-trace").exists()


@pytest.mark.unchecked_traces("an empty file named as a trace, on purpose")
@pytest.mark.parametrize("name", ["empty.json", "empty.perfetto-trace", "empty.json.gz"])
def test_an_empty_file_is_said_to_be_empty(tmp_path: Path, name: str) -> None:
    """Said first, before the output it would write (empty.perfetto-trace is its own
    default output), and not as 'starts with the end of the file'."""
    src = tmp_path / name
    src.write_bytes(gzip.compress(b"") if name.endswith(".gz") else b"")
    line = assert_one_line_error(tracer("convert", src), f"{src}: the file is empty")
    assert "overwrite" not in line and "end of the file" not in line, line
    spaces = tmp_path / "spaces.json"
    spaces.write_text(" \n\t\n")
    assert_one_line_error(tracer("convert", spaces), "holds nothing but white space")


@pytest.mark.parametrize("compress", [False, True])
def test_a_perfetto_trace_is_said_to_be_one_already(tmp_path: Path, compress: bool) -> None:
    trace = tmp_path / "run.perfetto-trace"
    with TraceWriter(trace) as w:
        track = w.thread_track(1, 2, "worker")
        w.begin(track, "task", 10)
        w.end(track, 20)
    if compress:
        packed = tmp_path / "run.perfetto-trace.gz"
        packed.write_bytes(gzip.compress(trace.read_bytes()))
        trace = packed
    before = trace.read_bytes()
    for args in ((trace,), (trace, "-o", tmp_path / "out.perfetto-trace")):
        line = assert_one_line_error(
            tracer("convert", *args),
            f"{trace}: it already is a Perfetto protobuf trace"
            f"{' (gzip-compressed)' if compress else ''}, not Chrome JSON",
        )
        assert "overwrite" not in line and "starts with" not in line, line
    assert trace.read_bytes() == before
    assert not (tmp_path / "out.perfetto-trace").exists()


def test_json_that_starts_with_a_newline_is_json(tmp_path: Path) -> None:
    """A newline is a TracePacket record's tag byte (0a): such a timeline is still
    converted, not called a Perfetto trace already."""
    src = tmp_path / "nl.json"
    src.write_text("\n" + json.dumps(_events(3)))
    result = tracer("convert", src)
    assert result.returncode == 0, result.stderr
    assert len(_slices(tmp_path / "nl.perfetto-trace")) >= 3


def test_a_missing_file_is_said_as_the_other_commands_say_it(tmp_path: Path) -> None:
    missing = tmp_path / "nonexist.json"
    line = assert_one_line_error(tracer("convert", missing))
    assert line == f"tracer: error: no such trace file: {missing}"
    assert line == assert_one_line_error(tracer("summary", missing))




def test_a_big_gzipped_timeline_converts_in_bounded_memory(tmp_path: Path) -> None:
    """~40 MB of JSON in a gzip file of a few MB peaks within a few MiB of a small one:
    inflated a chunk at a time, never whole."""
    def write(path: Path, rounds: int) -> int:
        size = 0
        with gzip.open(path, "wt") as f:
            f.write("[")
            for r in range(rounds):
                batch = _events(1000, workers=16, start=r * 100_000.0)
                text = ",".join(json.dumps(e) for e in batch) + ("," if r < rounds - 1 else "")
                f.write(text)
                size += len(text)
            f.write("]")
        return size

    small, big = tmp_path / "small.json.gz", tmp_path / "big.json.gz"
    small_size = write(small, 1)
    big_size = write(big, 50)
    assert big_size >= 40 << 20
    small_peak = _peak_rss(small, tmp_path / "small.perfetto-trace")
    big_peak = _peak_rss(big, tmp_path / "big.perfetto-trace")
    assert big_size >= 40 * small_size
    assert big_peak - small_peak < 16 << 20, (small_peak, big_peak)


def _task(i: int, ts: float, dur: float, worker: str) -> dict[str, Any]:
    return {"cat": "task::f", "name": "f", "ph": "X", "ts": ts, "dur": dur,
            "pid": "10.0.0.1", "tid": f"worker:{worker}", "args": {"task_id": f"{i:032x}"}}


def test_a_sequential_workers_tasks_in_any_order_stay_on_its_track(tmp_path: Path) -> None:
    """Ray's file lists a worker's tasks out of order here and there: a task fits the gap
    it ran in, so a worker that ran one task at a time shows one row (35 of 978 tasks
    of a real one were on a second lane, as if it ran two at once); tasks that touch,
    listed last first, too. Tasks that overlap (a threaded actor) take a lane each."""
    import random

    rng = random.Random(7)
    seq = [_task(i, i * 100.0, 60.0 + (i % 3) * 20.0, "aaaa") for i in range(300)]
    rng.shuffle(seq)  # ends touch the next task's start for i % 3 == 2
    actor = [_task(1000 + i, i * 50.0, 120.0, "bbbb") for i in range(4)]  # 2-3 at a time
    src = tmp_path / "order.json"
    src.write_text(json.dumps(seq + actor))
    out = tmp_path / "order.perfetto-trace"
    result = tracer("convert", src, "-o", out)
    assert result.returncode == 0, result.stderr
    model = read_trace(out, strict=True)
    assert not model.problems
    rows: dict[str, set[int]] = {}
    for s in model.slices:
        worker = s.args["task_id"] < f"{1000:032x}"
        rows.setdefault("aaaa" if worker else "bbbb", set()).add(s.track_uuid)
        # (one that ends where a task written before it begins ends 1 ns earlier)
        assert s.dur is not None and s.dur in (60_000, 80_000, 99_999, 100_000, 120_000), s
    assert len(rows["aaaa"]) == 1, rows
    assert len(rows["bbbb"]) == 3, rows
    assert len(model.slices) == 304

"""``tracer convert``: Ray's real timeline JSON (both of Ray's writers) in, a native trace out."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_cli import assert_one_line_error, tracer

from tracer.cli import chrome_json
from tracer.format import read_trace
from tracer.format.model import TraceModel
from tracer.ray import layout as L

N_TASKS = 12


@pytest.fixture(scope="module")
def timeline(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real Ray timeline of a few tasks and actor calls, in both of Ray's formats."""
    import ray
    from ray._private import profiling

    from tracer.ray.ray_events import GcsQuery
    from tracer.ray.ray_events_wire import parse_entries

    @ray.remote
    def square(x: int) -> int:
        time.sleep(0.005)
        return x * x

    @ray.remote
    class Counter:
        def add(self, x: int) -> int:
            return x

    refs = [square.remote(i) for i in range(N_TASKS)]
    ray.get(refs)
    counter = Counter.remote()  # type: ignore[attr-defined]
    ray.get([counter.add.remote(i) for i in range(3)])
    folder = tmp_path_factory.mktemp("convert")
    path = folder / "timeline.json"
    ids = {ref.task_id().hex() for ref in refs}
    deadline = time.monotonic() + 20
    while True:  # ray.timeline() waits a second itself; Ray reports events every 100 ms here
        ray.timeline(str(path))
        events = json.loads(path.read_text())
        seen = {e["args"].get("task_id") for e in events if e["cat"] == "task::square"}
        if ids <= seen or time.monotonic() > deadline:
            break
    # The dashboard's format (ray.util.state / the dashboard's timeline button), made by
    # Ray's own function from the same events as the state API hands them to it.
    gcs = GcsQuery(ray.get_runtime_context().gcs_address)
    job = bytes.fromhex(ray.get_runtime_context().get_job_id())
    tasks = []
    for ev in parse_entries(gcs.job(job, 10).events):  # (the GCS's reply, not parsed yet)
        if not ev.profile_events.events:
            continue
        p = ev.profile_events
        tasks.append({
            "task_id": ev.task_id.hex(), "job_id": ev.job_id.hex(),
            "attempt_number": ev.attempt_number, "func_or_class_name":
                ev.task_info.func_or_class_name, "actor_id": None,
            "profiling_data": {
                "node_ip_address": p.node_ip_address, "component_type": p.component_type,
                "component_id": p.component_id.hex(),
                "events": [{"event_name": e.event_name, "start_time": e.start_time / 1e6,
                            "end_time": e.end_time / 1e6,
                            "extra_data": json.loads(e.extra_data or "{}")} for e in p.events],
            },
        })
    gcs.close()
    dashboard = folder / "dashboard.json"
    dashboard.write_text(profiling.chrome_tracing_dump(tasks))
    return {"path": path, "dashboard": dashboard, "ids": ids}


def _convert(src: Path, out: Path) -> TraceModel:
    result = tracer("convert", src, "-o", out)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert str(out) in result.stdout
    model = read_trace(out, strict=True)
    assert not model.problems
    return model


def _check(model: TraceModel, ids: set[str]) -> None:
    tracks = model.tracks
    squares = [s for s in model.slices if s.name == L.RAY_TASK_PREFIX + "square"]
    assert ids <= {s.args["task_id"] for s in squares}  # (the session's Ray ran others too)
    for s in squares:
        phases = sorted((c for c in model.slices if c.parent_id == s.id), key=lambda c: c.ts)
        assert [p.name for p in phases] == [
            L.PHASE_DESERIALIZE, L.PHASE_EXECUTE, L.PHASE_STORE_OUTPUTS]
        assert phases[1].dur is not None and phases[1].dur >= 5_000_000  # the 5 ms sleep
        thread = tracks[s.track_uuid]
        while thread.kind != "thread":  # a lane under the worker
            assert thread.parent_uuid is not None
            thread = tracks[thread.parent_uuid]
        assert (thread.name or "").startswith("worker ")
        process = next(t for t in tracks.values() if t.kind == "process" and t.pid == thread.pid)
        assert (process.name or "").startswith("Node ")
    assert [s for s in model.slices if s.name == L.RAY_TASK_PREFIX + "Counter.add"]


def test_ray_timeline_converts(timeline: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "ray.perfetto-trace"
    model = _convert(timeline["path"], out)
    _check(model, timeline["ids"])
    # The driver's submit_task events are on the driver's thread.
    assert any((t.name or "").startswith("driver ") for t in model.tracks.values())
    assert timeline["path"].stat().st_size >= 5 * out.stat().st_size


def test_the_dashboards_timeline_converts(timeline: dict[str, Any], tmp_path: Path) -> None:
    model = _convert(timeline["dashboard"], tmp_path / "dash.perfetto-trace")
    _check(model, timeline["ids"])
    # Its metadata events name the nodes; they come last in the file, read first.
    assert any((t.name or "").startswith("Node 1") or "." in (t.name or "")
               for t in model.tracks.values() if t.kind == "process")


def test_default_output_and_object_form(timeline: dict[str, Any], tmp_path: Path) -> None:
    events = json.loads(timeline["path"].read_text())
    src = tmp_path / "wrapped.json"
    src.write_text(json.dumps({"displayTimeUnit": "ns", "traceEvents": events, "other": [1]}))
    result = tracer("convert", src)
    assert result.returncode == 0, result.stderr
    _check(read_trace(tmp_path / "wrapped.perfetto-trace"), timeline["ids"])


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_events_split_across_chunks_parse_whole(
    timeline: dict[str, Any], chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = timeline["path"].read_text()
    monkeypatch.setattr(chrome_json, "_CHUNK", chunk)
    assert list(chrome_json.iter_events(io.StringIO(text), "t")) == json.loads(text)
    wrapped = json.dumps({"a": {"b": [1, 2.5e3]}, "traceEvents": json.loads(text)}, indent=1)
    assert list(chrome_json.iter_events(io.StringIO(wrapped), "t")) == json.loads(text)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "the file is empty"),
        (" \n ", "holds nothing but white space"),
        ("hello", "not a Chrome trace JSON"),
        ('[{"ph": "X", "ts": 1,', "the file ends in the middle of an event"),
        ('[{"ph": "X", "name": "cut', "the file ends in the middle of an event"),
        ('[{"ph": "X", "ts": 1,}, {"ph": "X"}]', "invalid JSON"),
        ('[{"ph": "X"} {"ph": "X"}]', "expected ',' or ']'"),
        ("[1, 2]", "not a JSON object"),
        ('{"metadata": {}}', "no 'traceEvents'"),
        ('{"traceEvents": 3}', "'traceEvents' is not a list"),
        ("[] []", "unexpected data after the trace"),
        ("[]", "holds no events"),  # (an empty trace would read as a run of no tasks)
        ('{"traceEvents": []}', "holds no events"),
    ],
)
def test_bad_input_is_one_error_line(content: str, needle: str, tmp_path: Path) -> None:
    src = tmp_path / "bad.json"
    src.write_text(content)
    assert_one_line_error(tracer("convert", src), str(src), needle)
    assert not (tmp_path / "bad.perfetto-trace").exists()  # nothing written


def test_missing_folder_and_self_overwrite_are_errors(tmp_path: Path) -> None:
    assert_one_line_error(tracer("convert", tmp_path / "nope.json"), "nope.json")
    assert_one_line_error(tracer("convert", tmp_path), "is a folder")
    src = tmp_path / "t.json"
    src.write_text("[]")
    assert_one_line_error(tracer("convert", src, "-o", src), "overwrite the input")
    link = tmp_path / "hard.out"  # another name for the same file
    link.hardlink_to(src)
    assert_one_line_error(tracer("convert", src, "-o", link), "overwrite the input")
    assert src.read_text() == "[]"  # untouched
    assert_one_line_error(tracer("convert", src, "-o", f"{tmp_path / 'nofolder'}/"),
                          "no such folder")
    assert not (tmp_path / "nofolder").exists()


def test_output_into_a_folder_takes_the_default_name(tmp_path: Path) -> None:
    src = tmp_path / "timeline.json"
    src.write_text(json.dumps([{"ph": "X", "name": "task", "pid": 1, "tid": 2, "ts": 5,
                                "dur": 3}]))
    folder = tmp_path / "out"
    folder.mkdir()
    result = tracer("convert", src, "-o", folder)
    assert result.returncode == 0, result.stderr
    assert len(read_trace(folder / "timeline.perfetto-trace").slices) == 1


def test_events_it_cannot_place_are_skipped_and_counted(tmp_path: Path) -> None:
    src = tmp_path / "odd.json"
    src.write_text(json.dumps([
        {"ph": "X", "cat": "task::f", "name": "f", "pid": "n", "tid": "worker:ab", "ts": 10.0,
         "dur": 5.0, "args": {"task_id": "t1"}},
        {"ph": "B", "name": "begin", "pid": "n", "tid": "worker:ab", "ts": 1},
        {"ph": "X", "name": "no time", "pid": "n", "tid": "worker:ab"},
    ]))
    result = tracer("convert", src, "-o", tmp_path / "odd.perfetto-trace")
    assert result.returncode == 0
    assert result.stderr.strip() == "tracer: warning: 2 event(s) skipped: not complete ('X') " \
        "events with a time"
    model = read_trace(tmp_path / "odd.perfetto-trace")
    assert [(s.name, s.ts, s.dur) for s in model.slices] == [("ray task f", 10_000, 5_000)]


def test_a_json_with_nothing_it_can_place_is_an_error_that_says_what_it_is(
    tmp_path: Path,
) -> None:
    """Daft's own tracer writes begin/end events (a Daft user who forgot tracer's
    install() has one): it converted to an empty trace with status 0 (a fresh user's
    review). Now an error that says what the file is and what to do, and no output."""
    src = tmp_path / "trace_RayRunner.json"
    src.write_text(json.dumps([
        {"ph": "B", "name": "wave", "pid": 1, "tid": 1, "ts": 1},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 5},
        {"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 3},
    ]))
    out = tmp_path / "daft.perfetto-trace"
    assert_one_line_error(
        tracer("convert", src, "-o", out), "none of its 3 event(s) is a complete ('X') event",
        "2 are begin/end ('B'/'E') events", "tracer.integrations.daft.install()")
    assert not out.exists()
    src.write_text(json.dumps([{"ph": "X", "name": "no time", "pid": 1, "tid": 1}]))
    line = assert_one_line_error(tracer("convert", src, "-o", out), "none of its 1 event(s)")
    assert "Daft" not in line and not out.exists()


_MEASURE = """
import resource, sys
from pathlib import Path
from tracer.cli.convert import convert
convert(Path(sys.argv[1]), Path(sys.argv[2]))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def _peak_rss(src: Path, out: Path) -> int:
    result = subprocess.run([sys.executable, "-c", _MEASURE, str(src), str(out)],
                            capture_output=True, text=True, timeout=600, check=True)
    return int(result.stdout.strip())


def test_a_big_timeline_converts_in_bounded_memory(
    timeline: dict[str, Any], tmp_path: Path
) -> None:
    """~60 MB of JSON (Ray's events over and over, shuffled, later in time each round)
    peaks within a few MiB of what one round does."""
    events = json.loads(timeline["path"].read_text())
    span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events) + 1
    rng = random.Random(1)

    def write(path: Path, rounds: int) -> None:
        with path.open("w") as f:
            f.write("[")
            for r in range(rounds):
                batch = [dict(e, ts=e["ts"] + r * span) for e in events]
                rng.shuffle(batch)
                f.write(",".join(json.dumps(e) for e in batch) + ("," if r < rounds - 1 else ""))
            f.write("]")

    size = len(json.dumps(events))
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    write(small, 1)
    write(big, max(20, (60 << 20) // size))
    small_peak = _peak_rss(small, tmp_path / "small.perfetto-trace")
    big_peak = _peak_rss(big, tmp_path / "big.perfetto-trace")
    assert big.stat().st_size >= 20 * small.stat().st_size
    assert big_peak - small_peak < 16 << 20, (small_peak, big_peak)
    # (trace_processor checks the big trace too: every trace a test writes is loaded.)

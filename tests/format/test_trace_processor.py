"""Traces from TraceWriter, loaded into trace_processor itself.

These need a ``trace_processor_shell`` binary: set ``TRACE_PROCESSOR_PATH`` to
it (download one on a machine with network access, e.g. with
``perfetto.trace_processor`` or from https://get.perfetto.dev/trace_processor).
Without it every test here is skipped, or fails where trace_processor is
required (see ``tests/tp_check.py``).

Each test checks trace_processor's tables (slice, thread, process, track,
counter_track, counter, flow, args) against what :func:`read_trace` reads from
the same file, and that none of the stats the format reference lists as
silent failures is set (``interned_data*``, ``track_event*``, ``misplaced*``,
``flow*``, ``clock_sync_failure*``; some are only severity "info" or
"notice", so checking errors alone is not enough).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from trace_helpers import FakeClock, record_ends

from tracer.format import TraceModel, TraceWriter, read_trace

T0 = 1_700_000_000_000_000_000

WATCHED_STATS = ("interned_data*", "track_event*", "misplaced*", "flow*", "clock_sync_failure*")


@pytest.fixture(scope="module")
def bin_path(trace_processor_bin: str) -> str:
    return trace_processor_bin


class Loaded:
    """A trace loaded in trace_processor, with small query helpers."""

    def __init__(self, tp: Any) -> None:
        self.tp = tp

    def rows(self, sql: str) -> list[dict[str, Any]]:
        return [dict(row.__dict__) for row in self.tp.query(sql)]

    def value(self, sql: str) -> Any:
        (row,) = self.rows(sql)
        (value,) = row.values()
        return value

    def watched_stats(self) -> list[dict[str, Any]]:
        where = " OR ".join(f"name GLOB '{pattern}'" for pattern in WATCHED_STATS)
        return self.rows(f"SELECT name, idx, severity, value FROM stats WHERE value > 0 "
                         f"AND ({where})")

    def error_stats(self) -> list[dict[str, Any]]:
        return self.rows("SELECT name, idx, severity, value FROM stats WHERE value > 0 "
                         "AND severity IN ('error', 'data_loss')")


@pytest.fixture
def load(bin_path: str) -> Iterator[Any]:
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    opened: list[Any] = []

    def _load(path: Path) -> Loaded:
        tp = TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=bin_path))
        opened.append(tp)
        return Loaded(tp)

    yield _load
    for tp in opened:
        tp.close()


def sanitize(name: str) -> str:
    """trace_processor's arg key for an annotation name."""
    return name.replace(".", "_").replace("[", "_").replace("]", "_")


def flatten(args: dict[str, Any]) -> dict[str, Any]:
    """Debug annotations as trace_processor's args keys (``debug.a.b``, ``debug.a[0]``)."""
    out: dict[str, Any] = {}

    def walk(key: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{key}.{sanitize(k)}", v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(f"{key}[{i}]", v)
        elif value is not None:
            out[key] = value

    for name, value in args.items():
        walk(f"debug.{sanitize(name)}", value)
    return out


def tp_args(loaded: Loaded, arg_set_id: int | None) -> dict[str, Any]:
    if arg_set_id is None:
        return {}
    out = {}
    for row in loaded.rows(
        f"SELECT key, value_type, int_value, string_value, real_value FROM args "
        f"WHERE arg_set_id = {arg_set_id} AND key GLOB 'debug.*'"
    ):
        kind = row["value_type"]
        if kind == "bool":
            out[row["key"]] = bool(row["int_value"])
        elif kind in ("int", "uint"):
            out[row["key"]] = row["int_value"]
        elif kind == "real":
            out[row["key"]] = row["real_value"]
        else:
            out[row["key"]] = row["string_value"]
    return out


def check_against_model(loaded: Loaded, model: TraceModel) -> None:
    """trace_processor's slices, counters, flows and args are what read_trace reads."""
    tp_slices = loaded.rows(
        "SELECT id, ts, dur, name, category, depth, arg_set_id FROM slice ORDER BY ts, id")
    ours = [(s.ts, -1 if s.dur is None else s.dur, s.name, s.category, s.depth)
            for s in model.slices]
    ours += [(i.ts, 0, i.name, i.category, i.depth) for i in model.instants]
    theirs = [(r["ts"], r["dur"], r["name"], r["category"], r["depth"]) for r in tp_slices]
    assert Counter(theirs) == Counter(ours)

    by_key = {(r["ts"], r["name"]): r for r in tp_slices}
    for item in (*model.slices, *model.instants):
        row = by_key[(item.ts, item.name)]
        assert tp_args(loaded, row["arg_set_id"]) == flatten(item.args), item

    tp_counters = loaded.rows(
        "SELECT c.ts AS ts, c.value AS value, t.name AS name FROM counter c "
        "JOIN counter_track t ON c.track_id = t.id")
    assert Counter((r["ts"], r["name"], float(r["value"])) for r in tp_counters) == Counter(
        (c.ts, model.tracks[c.track_uuid].name, float(c.value)) for c in model.counters)

    ts_name = {s.id: (s.ts, s.name) for s in model.slices} | {
        i.id: (i.ts, i.name) for i in model.instants}
    tp_flows = loaded.rows(
        "SELECT so.ts AS out_ts, so.name AS out_name, si.ts AS in_ts, si.name AS in_name, "
        "f.trace_id AS flow_id FROM flow f JOIN slice so ON f.slice_out = so.id "
        "JOIN slice si ON f.slice_in = si.id")
    assert Counter(
        (r["flow_id"], (r["out_ts"], r["out_name"]), (r["in_ts"], r["in_name"]))
        for r in tp_flows
    ) == Counter((f.flow_id, ts_name[f.source_id], ts_name[f.dest_id]) for f in model.flows)


def write_runner_like_trace(path: Path, *, compress: bool = False, waves: int = 4) -> None:
    with TraceWriter(path, clock=FakeClock(T0), compress=compress, buffer_size=4096) as w:
        scheduler = w.process_track(100, "Scheduler", rank=0)
        loop = w.thread_track(100, 101, "dispatch loop", rank=0)
        node = w.process_track(200, "node-1", rank=1)
        tasks = w.track("Tasks", parent=node, child_ordering="explicit")
        lanes = [w.track("task", parent=tasks, rank=1) for _ in range(3)]
        stage = w.track("stage map", parent=tasks, rank=0, merge=False,
                        description="the map stage")
        inflight = w.counter_track("tasks in flight", parent=scheduler)
        memory = w.counter_track("memory", parent=node, unit="bytes", unit_multiplier=1024)
        rate = w.counter_track("rate", unit=None, unit_name="rows/s")
        now = T0
        w.begin(stage, "map", now + 1, category="stage")
        for wave in range(waves):
            now += 1_000_000
            w.begin(loop, "wave", now, category="scheduler", args={"wave": wave})
            flows = []
            for i, lane in enumerate(lanes):
                flow = w.new_flow_id()
                flows.append(flow)
                w.instant(loop, "submit", now + 10 + i, flows=[flow],
                          args={"task_id": f"{wave}-{i}"})
                w.begin(lane, "task", now + 100 + i, category="task",
                        terminating_flows=[flow],
                        args={"task_id": f"{wave}-{i}", "attempt": 0,
                              "resource_request": {"num_cpus": 1.5, "gpus": [0, 1]},
                              "ok.[x]": True})
            w.counter(inflight, len(lanes), now + 200)
            w.counter(memory, 1000 + wave, now + 300)
            w.counter(rate, 2.5 * wave, now + 350)
            for lane in lanes:
                w.end(lane, now + 500_000, args={"rows": 10})
            w.counter(inflight, 0, now + 500_100)
            w.end(loop, now + 600_000)
        # A slice reported late, after later events were written.
        w.complete(lanes[0], "task", T0 + 50, T0 + 90, args={"task_id": "late"})
        w.end(stage, now + 700_000)


def test_runner_like_trace_imports_cleanly(tmp_path: Path, load: Any) -> None:
    path = tmp_path / "t.perfetto-trace"
    write_runner_like_trace(path)
    model = read_trace(path, strict=True)
    loaded = load(path)
    assert loaded.watched_stats() == []
    assert loaded.error_stats() == []
    check_against_model(loaded, model)

    assert loaded.rows("SELECT pid, name FROM process WHERE pid IN (100, 200) ORDER BY pid") == [
        {"pid": 100, "name": "Scheduler"}, {"pid": 200, "name": "node-1"}]
    thread = loaded.rows("SELECT t.tid AS tid, t.name AS name, p.pid AS pid FROM thread t "
                         "JOIN process p USING (upid) WHERE t.tid = 101")
    assert thread == [{"tid": 101, "name": "dispatch loop", "pid": 100}]
    on_thread = loaded.value(
        "SELECT count(*) FROM slice s JOIN thread_track tt ON s.track_id = tt.id "
        "JOIN thread USING (utid) WHERE thread.tid = 101")
    assert on_thread == 4 + 12  # waves and submits

    late = loaded.rows("SELECT ts, dur FROM slice WHERE EXTRACT_ARG(arg_set_id, "
                       "'debug.task_id') = 'late'")
    assert late == [{"ts": T0 + 50, "dur": 40}]
    cpus = loaded.rows("SELECT DISTINCT EXTRACT_ARG(arg_set_id, "
                       "'debug.resource_request.num_cpus') AS cpus FROM slice WHERE name = 'task' "
                       "AND EXTRACT_ARG(arg_set_id, 'debug.task_id') != 'late'")
    assert cpus == [{"cpus": 1.5}]

    units = {r["name"]: r["unit"] for r in loaded.rows("SELECT name, unit FROM counter_track")}
    assert units["tasks in flight"] == "count"
    assert units["memory"] == "bytes"
    assert units["rate"] == "rows/s"
    memory = loaded.rows("SELECT c.value AS value FROM counter c JOIN counter_track t "
                         "ON c.track_id = t.id WHERE t.name = 'memory' ORDER BY c.ts")
    assert [r["value"] for r in memory] == [1024.0 * (1000 + w) for w in range(4)]

    assert loaded.value("SELECT count(*) FROM flow") == 12
    names = {r["name"] for r in loaded.rows("SELECT DISTINCT name FROM track")}
    assert {"Tasks", "task", "stage map", "tasks in flight", "memory", "rate"} <= names
    # The stage track keeps its own uuid (merge=False): it can be found by it.
    stage_uuid = next(u for u, t in model.tracks.items() if t.name == "stage map")
    stage_rows = loaded.rows(
        f"SELECT name FROM track WHERE EXTRACT_ARG(source_arg_set_id, 'trace_id') = {stage_uuid}")
    assert stage_rows == [{"name": "stage map"}]


def test_compressed_trace_loads_the_same(tmp_path: Path, load: Any) -> None:
    plain = tmp_path / "plain.perfetto-trace"
    packed = tmp_path / "packed.perfetto-trace"
    write_runner_like_trace(plain)
    write_runner_like_trace(packed, compress=True)
    query = "SELECT ts, dur, name, category, depth FROM slice ORDER BY ts, name, depth"
    a, b = load(plain), load(packed)
    assert b.rows(query) == a.rows(query)
    assert b.watched_stats() == [] and b.error_stats() == []
    check_against_model(b, read_trace(packed, strict=True))


def test_cut_trace_loads_with_the_last_slice_open(tmp_path: Path, load: Any) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        lane = w.track("lane", merge=False)
        w.begin(lane, "a", T0 + 10)
        w.end(lane, T0 + 20)
        w.begin(lane, "b", T0 + 30)
        w.end(lane, T0 + 40)
    cut = tmp_path / "cut.perfetto-trace"
    cut.write_bytes(path.read_bytes()[:-3])
    loaded = load(cut)
    assert loaded.rows("SELECT name, dur FROM slice ORDER BY ts") == [
        {"name": "a", "dur": 10}, {"name": "b", "dur": -1}]
    assert loaded.error_stats() == []
    check_against_model(loaded, read_trace(cut))


def test_cut_compressed_trace_loads_up_to_its_last_bundle(tmp_path: Path, load: Any) -> None:
    path = tmp_path / "t.perfetto-trace"
    # Enough waves for several 4 KiB bundles (4 waves fit in one).
    write_runner_like_trace(path, compress=True, waves=60)
    data = path.read_bytes()
    ends = record_ends(data)
    assert len(ends) >= 3
    cut = tmp_path / "cut.perfetto-trace"
    cut.write_bytes(data[: ends[-2] + 5])
    loaded = load(cut)
    assert loaded.watched_stats() == []
    check_against_model(loaded, read_trace(cut))


def test_counter_sequences_import_like_the_reader_reads_them(tmp_path: Path, load: Any) -> None:
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(T0)) as w:
        cpu = w.counter_track("cpu")
        rss = w.counter_track("rss", unit="bytes", unit_multiplier=1024)
        gpu = w.counter_track("gpu")
        sequence = w.counter_sequence([cpu, rss, gpu])
        lane = w.track("lane")
        for i in range(20):
            w.begin(lane, "step", T0 + 1_000_000 * i)
            sequence.sample(T0 + 1_000_000 * i + 500, i % 3, 1000 + i // 2, None if i % 2 else i)
            w.end(lane, T0 + 1_000_000 * i + 900)
        sequence.sample(T0 + 10, 9, 9, 9)  # late
    model = read_trace(path, strict=True)
    loaded = load(path)
    assert loaded.watched_stats() == [] and loaded.error_stats() == []
    check_against_model(loaded, model)


@pytest.mark.unchecked_traces("the failures trace_processor reports, on purpose")
def test_reader_problems_match_trace_processor_stats(tmp_path: Path, load: Any) -> None:
    """The two failures the reference checked in trace_processor, seen by both."""
    from trace_helpers import trace_bytes

    from tracer._proto import perfetto_trace_subset_pb2 as pb

    counter_event = pb.TracePacket(trusted_packet_sequence_id=1, timestamp=5)
    counter_event.track_event.type = pb.TrackEvent.TYPE_COUNTER
    counter_event.track_event.track_uuid = 3
    counter_event.track_event.counter_value = 1
    descriptor = pb.TracePacket(trusted_packet_sequence_id=1)
    descriptor.track_descriptor.uuid = 3
    descriptor.track_descriptor.name = "c"
    descriptor.track_descriptor.counter.unit = pb.CounterDescriptor.UNIT_COUNT
    named = pb.TracePacket(trusted_packet_sequence_id=2, timestamp=6)
    named.track_event.type = pb.TrackEvent.TYPE_INSTANT
    named.track_event.track_uuid = 4
    named.track_event.name_iid = 1
    named.interned_data.event_names.add(iid=1, name="lost")
    track = pb.TracePacket(trusted_packet_sequence_id=2)
    track.track_descriptor.uuid = 4
    track.track_descriptor.name = "t"
    path = tmp_path / "t.perfetto-trace"
    path.write_bytes(trace_bytes(
        pb.TracePacket(trusted_packet_sequence_id=1, sequence_flags=1),
        counter_event, descriptor, track, named))
    kinds = {p.kind for p in read_trace(path).problems}
    assert kinds == {"counter_before_descriptor", "not_cleared"}
    stats = {r["name"] for r in load(path).watched_stats()}
    assert "track_event_counter_invalid_track_uuid" in stats
    assert "interned_data_skipped_incremental_state_invalid" in stats

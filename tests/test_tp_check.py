"""The trace_processor check every test gets (tests/tp_check.py) fails a test that writes a
trace trace_processor rejects, and passes one it reads as written."""

from __future__ import annotations

from pathlib import Path

import pytest
import tp_check

from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.format import TraceWriter
from tracer.ray import layout as L

T0 = 1_700_000_000_000_000_000

_WRITE = '''
from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.format import TraceWriter
import pytest

def _good(path):
    with TraceWriter(path) as w:
        lane = w.track("lane")
        w.begin(lane, "a")
        w.end(lane)

def _no_sequence_id(path):
    """A track event without a trusted sequence id: trace_processor drops it."""
    desc = pb.TracePacket(trusted_packet_sequence_id=1)
    desc.track_descriptor.uuid = 5
    desc.track_descriptor.name = "lane"
    event = pb.TracePacket(timestamp=10)
    event.track_event.type = pb.TrackEvent.TYPE_INSTANT
    event.track_event.track_uuid = 5
    event.track_event.name = "lost"
    path.write_bytes(pb.Trace(packet=[desc, event]).SerializeToString())

def test_good(tmp_path):
    _good(tmp_path / "good.perfetto-trace")

def test_rejected(tmp_path):
    _no_sequence_id(tmp_path / "bad.perfetto-trace")

@pytest.mark.unchecked_traces("on purpose")
def test_rejected_on_purpose(tmp_path):
    _no_sequence_id(tmp_path / "bad.perfetto-trace")

def test_after_the_unchecked_one(tmp_path):
    """Runs within a second of the one before: its bad trace is not blamed on this test."""
'''


@pytest.mark.unchecked_traces("the inner run's traces: it checks them itself")
def test_a_trace_trace_processor_rejects_fails_its_test(
    pytester: pytest.Pytester, trace_processor_bin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    monkeypatch.setenv("TRACE_PROCESSOR_PATH", trace_processor_bin)
    pytester.makeconftest('pytest_plugins = ["tp_check"]')
    pytester.makepyfile(test_inner=_WRITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_rejected*",
        "*bad.perfetto-trace*",
        "*stat track_event_missing_sequence_id = 1 (error)*",
    ])


def test_it_finds_a_phantom_thread(tmp_path: Path, trace_processor_bin: str) -> None:
    """A tid over 32 bits in a descriptor after the first event: trace_processor adds a
    thread of its own (what the runner's worker tracks once did)."""
    packets = [
        pb.TracePacket(trusted_packet_sequence_id=1, sequence_flags=1),
    ]
    desc = pb.TracePacket(trusted_packet_sequence_id=1)
    desc.track_descriptor.uuid = 1
    desc.track_descriptor.name = "x"
    event = pb.TracePacket(trusted_packet_sequence_id=1, timestamp=T0)
    event.track_event.type = pb.TrackEvent.TYPE_INSTANT
    event.track_event.track_uuid = 1
    event.track_event.name = "e"
    thread = pb.TracePacket(trusted_packet_sequence_id=1)
    thread.track_descriptor.uuid = 2
    thread.track_descriptor.thread.pid = 7
    thread.track_descriptor.thread.tid = (1 << 32) | 9
    thread.track_descriptor.thread.thread_name = "worker 9"
    path = tmp_path / "phantom.perfetto-trace"
    path.write_bytes(pb.Trace(packet=[*packets, desc, event, thread]).SerializeToString())
    found = tp_check.problems(path, trace_processor_bin)
    assert any(p.startswith("threads:") and "(9, None)" in p for p in found), found
    path.unlink()  # written on purpose: not for the check after this test


def _runner_like(path: Path, *, arrow: bool) -> None:
    with TraceWriter(path) as w:
        lane = w.track(L.TASK_LANE)
        stage = w.track("0: map", merge=False)
        worker = w.track("worker 1")
        flow = w.new_flow_id()
        w.begin(lane, "map", T0, category=L.CAT_TASK,
                args={L.ARG_TASK_ID: "0-0", L.ARG_STAGE_ID: 0})
        w.begin(worker, "map", T0 + 10, category=L.CAT_EXECUTION, args={L.ARG_TASK_ID: "0-0"},
                terminating_flows=[flow] if arrow else None)
        w.end(worker, T0 + 20)
        w.end(lane, T0 + 30)
        w.begin(stage, "map", T0, category=L.CAT_STAGE, args={L.ARG_STAGE_ID: 0},
                flows=[flow] if arrow else None)
        w.end(stage, T0 + 30)


def test_it_checks_the_stage_arrows(tmp_path: Path, trace_processor_bin: str) -> None:
    good, bad = tmp_path / "good.perfetto-trace", tmp_path / "bad.perfetto-trace"
    _runner_like(good, arrow=True)
    _runner_like(bad, arrow=False)
    assert tp_check.problems(good, trace_processor_bin) == []
    found = tp_check.problems(bad, trace_processor_bin)
    assert found == ["executions of 1 tasks with no arrow from their stage, e.g. ['0-0']"]
    bad.unlink()

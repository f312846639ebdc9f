"""scan_trace hands over what read_trace reads, on every kind of input, holding only a window.

The reference is read_trace: for any input, the events, values, counts,
problems and errors of a scan are read_trace's (scan_helpers.as_model turns
a scan back into a TraceModel to compare).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scan_helpers import Collect, assert_same_model, scanned_model
from test_reader_problems import (
    BAD_TRACES,
    BEGIN,
    COUNTER,
    END,
    INSTANT,
    SMALL_TRACES,
    counter_track,
    event,
    setup,
    track,
)
from trace_helpers import trace_bytes

from tracer.errors import TraceOrderError, TraceReadError
from tracer.format import (
    DEFAULT_WINDOW_NS,
    CounterSample,
    TraceVisitor,
    _framing,
    read_trace,
    scan_trace,
)

ROOT = Path(__file__).resolve().parents[2]
FUZZ = sorted((Path(__file__).parent / "fuzz_regressions").glob("*.bin"))


def _simulated_run() -> Any:
    """benchmarks/simulated_run.py: real RunnerTracer traces of any size, without Ray."""
    spec = importlib.util.spec_from_file_location(
        "simulated_run", ROOT / "benchmarks" / "simulated_run.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["simulated_run"] = module
    spec.loader.exec_module(module)
    return module


simulated_run = _simulated_run()


@pytest.fixture(scope="module")
def run_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A level-1 runner trace of 600 tasks (compressed, lanes written out of order)."""
    path = tmp_path_factory.mktemp("scan") / "run.perfetto-trace"
    return simulated_run.write_run(path, 600, nodes=2, workers_per_node=2)


def same_as_read(source: Any, **options: Any) -> None:
    assert_same_model(read_trace(source), scanned_model(source, **options))


# ------------------------------------------------------------- same as read_trace


@pytest.mark.parametrize("kind", sorted(BAD_TRACES))
def test_every_problem_kind_is_found_as_read_trace_finds_it(kind: str) -> None:
    data = BAD_TRACES[kind]()
    for window in (DEFAULT_WINDOW_NS, None, 0):
        same_as_read(data, window_ns=window)
    with pytest.raises(TraceReadError, match=kind):
        scan_trace(data, TraceVisitor(), strict=True)


@pytest.mark.parametrize("compress", [False, True])
def test_writer_traces_read_the_same(compress: bool, tmp_path: Path) -> None:
    data = SMALL_TRACES[compress]
    same_as_read(data)
    path = tmp_path / "small.perfetto-trace"
    path.write_bytes(data)
    same_as_read(path, window_ns=None)


@pytest.mark.parametrize("window", [DEFAULT_WINDOW_NS, 10**12, None])
def test_a_runner_trace_reads_the_same(run_trace: Path, window: int | None) -> None:
    model = read_trace(run_trace)
    assert len(model.slices) > 5000 and model.flows and not model.problems
    assert_same_model(model, scanned_model(run_trace, window_ns=window))


def test_a_runner_trace_writes_task_lanes_out_of_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the window exists: with none (0), the first late END stops the scan.

    (Events are matched at the end of each bundle or chunk of the file, so an
    uncompressed trace read in small chunks shows it best.)
    """
    path = simulated_run.write_run(tmp_path / "raw.perfetto-trace", 300, compress=False)
    monkeypatch.setattr(_framing, "CHUNK_SIZE", 256)
    with pytest.raises(TraceOrderError, match="larger window_ns") as err:
        scan_trace(path, TraceVisitor(), window_ns=0)
    assert 0 < err.value.lateness_ns < DEFAULT_WINDOW_NS // 10
    assert read_trace(path).tracks[err.value.track_uuid].name == "tasks"
    same_as_read(path)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1000])
def test_any_chunk_size_reads_the_same(
    chunk: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files are read in chunks: records (and bundles) cut by a chunk's end are read whole."""
    expected = {c: read_trace(SMALL_TRACES[c]) for c in (False, True)}
    monkeypatch.setattr(_framing, "CHUNK_SIZE", chunk)
    for compress, data in SMALL_TRACES.items():
        path = tmp_path / f"small{compress}.perfetto-trace"
        path.write_bytes(data)
        assert_same_model(expected[compress], read_trace(path))
        assert_same_model(expected[compress], scanned_model(path))
        for cut in range(0, len(data), max(1, len(data) // 37)):
            path.write_bytes(data[:cut])
            try:
                whole = read_trace(data[:cut])
            except TraceReadError as exc:
                with pytest.raises(TraceReadError) as got:
                    scanned_model(path)
                assert str(got.value) == str(exc).replace("trace data", f"trace file {path}")
                continue
            assert_same_model(whole, read_trace(path))
            assert_same_model(whole, scanned_model(path))


@pytest.mark.parametrize("path", FUZZ, ids=lambda p: p.name)
def test_fuzz_regressions(path: Path) -> None:
    try:
        expected = read_trace(path)
    except TraceReadError as exc:
        with pytest.raises(TraceReadError) as got:
            scan_trace(path, TraceVisitor())
        assert str(got.value) == str(exc)
        return
    assert_same_model(expected, scanned_model(path))


@settings(max_examples=300, deadline=None)
@given(
    compress=st.booleans(),
    edits=st.lists(
        st.tuples(st.sampled_from(["set", "delete", "insert", "cut"]), st.integers(0, 1 << 16),
                  st.binary(min_size=1, max_size=8)),
        min_size=1, max_size=6),
    strict=st.booleans(),
    window=st.sampled_from([DEFAULT_WINDOW_NS, 0, 5, None]),
)
def test_damaged_traces_read_the_same(
    compress: bool, edits: list[tuple[str, int, bytes]], strict: bool, window: int | None
) -> None:
    data = bytearray(SMALL_TRACES[compress])
    for op, position, chunk in edits:
        at = position % (len(data) + 1)
        if op == "set" and data:
            data[at % len(data)] = chunk[0]
        elif op == "delete":
            del data[at : at + len(chunk)]
        elif op == "insert":
            data[at:at] = chunk
        else:
            del data[at:]
    try:
        expected = read_trace(bytes(data), strict=strict)
    except TraceReadError:
        with pytest.raises(TraceReadError):
            scanned_model(bytes(data), strict=strict, window_ns=window)
        return
    try:
        got = scanned_model(bytes(data), strict=strict, window_ns=window)
    except TraceOrderError:
        assert window is not None  # damage reordered a track more than the window allows
        got = scanned_model(bytes(data), strict=strict, window_ns=None)
    assert_same_model(expected, got)


# ----------------------------------------------------------------------- order


def _late_trace() -> bytes:
    """Track 1: slices [100, 200] and [1000, 1100], then, written after them, [50, 150]."""
    return trace_bytes(
        setup(), track(1), track(2),
        event(BEGIN, 1, 100, name="a"), event(END, 1, 200),
        event(BEGIN, 1, 1000, name="c"), event(END, 1, 1100),
        event(INSTANT, 2, 300, name="elsewhere"),
        event(BEGIN, 1, 50, name="b"), event(END, 1, 150),
    )


def test_events_written_late_are_matched_in_timestamp_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "late.perfetto-trace"
    path.write_bytes(_late_trace())
    model = read_trace(path)
    # In timestamp order: BEGIN b@50, BEGIN a@100, END@150 (closes a), END@200 (closes b).
    assert [(s.name, s.ts, s.dur, s.depth) for s in model.slices] == [
        ("b", 50, 150, 0), ("a", 100, 50, 1), ("c", 1000, 100, 0),
    ]
    monkeypatch.setattr(_framing, "CHUNK_SIZE", 1)  # events matched after every record
    for window in (1050, 10**9, None):
        same_as_read(path, window_ns=window)
    # A smaller window let [100, 200] be matched before b came: too late for it.
    with pytest.raises(TraceOrderError) as err:
        scan_trace(path, TraceVisitor(), window_ns=899)
    assert (err.value.track_uuid, err.value.lateness_ns) == (1, 1050)


def test_events_before_their_track_descriptor_wait_for_it() -> None:
    data = trace_bytes(
        setup(), event(BEGIN, 7, 10, name="early"), event(END, 7, 20),
        track(1), event(INSTANT, 1, 10_000_000_000, name="much later"), track(7),
        event(COUNTER, 3, 5, counter_value=1), counter_track(3),
        event(BEGIN, 9, 30, name="never described"),
    )
    model = read_trace(data)
    assert [s.name for s in model.slices] == ["early"]
    assert set(model.problem_counts) == {"undeclared_track", "counter_before_descriptor"}
    same_as_read(data, window_ns=0)


def test_bad_windows_are_refused() -> None:
    for bad in (-1, True):
        with pytest.raises(ValueError, match="window_ns"):
            scan_trace(_late_trace(), TraceVisitor(), window_ns=bad)


# ------------------------------------------------------------------- the visitor


def test_the_visitor_gets_each_track_in_order_and_counters_only_if_it_wants_them() -> None:
    data = SMALL_TRACES[True]

    class Order(TraceVisitor):
        def __init__(self) -> None:
            self.ends: dict[int, list[int]] = {}

        def slice(self, s: Any) -> None:
            if s.dur is not None:
                self.ends.setdefault(s.track_uuid, []).append(s.ts + s.dur)

    order = Order()
    scan = scan_trace(data, order)
    assert scan.counter_count == len(read_trace(data).counters) > 0
    for ends in order.ends.values():
        assert ends == sorted(ends)
    counted = Collect()
    scan_trace(data, counted)
    assert len(counted.counters) == scan.counter_count
    assert all(isinstance(c, CounterSample) for c in counted.counters)


# ---------------------------------------------------------------------- memory


#: One read in a fresh interpreter, which prints its peak resident memory in KiB
#: (VmHWM, Linux) before and after. A fresh process for each read: in the test
#: session, process-wide tables (interned strings, caches of the libraries earlier
#: tests loaded) that happen to grow during a measured read would count in its peak,
#: by megabytes. Resident memory is what a machine runs out of, and it counts the C
#: readers' own allocations too. (Not getrusage's ru_maxrss: Linux carries the
#: forking parent's peak over an exec into it.)
_PEAK = """
import sys
from tracer.format import TraceVisitor, read_trace, scan_trace
def peak_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
before = peak_kib()
if sys.argv[1] == "scan":
    scan_trace(sys.argv[2], TraceVisitor(), window_ns=200_000_000)
else:
    model = read_trace(sys.argv[2])
print(before, peak_kib())
"""


def _peak_growth(kind: str, path: Path) -> int:
    """Bytes by which reading ``path`` raised a fresh interpreter's peak RSS."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, kind, str(path)],
        capture_output=True, text=True, check=True, timeout=300,
    )
    before, after = (int(kib) for kib in out.stdout.split())
    return (after - before) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's VmHWM")
def test_memory_grows_with_what_the_visitor_keeps_not_with_the_trace(tmp_path: Path) -> None:
    """Per extra task, read_trace keeps its ~20 events (~10 KB); a scan keeps its flow
    ids (to match them in timestamp order at the end) and a window of events.

    The window is 0.2 s here, so that every run (~1.2 s of simulated time and more)
    fills it: what it holds does not grow with the run. The scan's runs differ by
    12,000 tasks, so that the few MB its chunks and bundles take at their peak
    (which moves with where the bundles fall) weigh little per task.

    Measured as peak RSS (each read in its own process) rather than with tracemalloc,
    which made the test's two scans 10-15 times slower (30-50 s) and does not see
    what the C readers allocate themselves.
    """
    runs = {
        n: simulated_run.write_run(tmp_path / f"run{n}.perfetto-trace", n)
        for n in (2000, 6000, 14000)
    }
    scan_per_task = (_peak_growth("scan", runs[14000]) - _peak_growth("scan", runs[2000])) / 12000
    read_per_task = (_peak_growth("read", runs[6000]) - _peak_growth("read", runs[2000])) / 4000
    assert read_per_task > 5000, read_per_task
    # Measured 530-575 B on Pythons 3.10 and 3.11, with the C readers and without
    # (2026-12-06, three runs each), against read_trace's ~13,000.
    assert scan_per_task < 800, scan_per_task

"""Starting trace_processor for a query: tracer's start against the perfetto package's own.

Run by hand (it is not a test), from the project root, with a trace_processor binary:

    TRACE_PROCESSOR_PATH=../shared/bin/trace_processor_shell \\
        .venv/bin/python benchmarks/bench_query_start.py            # ~1 min
    .venv/bin/python benchmarks/bench_query_start.py --repeats 5    # a quick look

Every ``tracer query``, and ``tracer summary`` / ``tracer memory`` / ``TraceQuery``
with trace_processor, starts a trace_processor_shell server, loads the trace into it
and runs tracer_tables.sql before the first answer. The perfetto package's own start
(``TraceProcessor(trace, config=TraceProcessorConfig(bin_path=...))``) asks a server
it started whether it is up once a second; tracer starts the server itself and asks
every few ms (tracer/query/processor.py). Both are timed here, in this process and
interleaved (the order swaps each repeat), from nothing to the answer of one query on
a small trace (the same for both: tracer_tables.sql is not run), and the server
stopped; medians and the spread (min-max). Then ``tracer query TRACE "SELECT 1"`` as a
user runs it (a fresh Python each time). Target: tracer's start at most a quarter of the
package's (it was the package's, plus tracer_tables.sql). The script exits 1 if missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tracer.format import TraceWriter  # noqa: E402
from tracer.query import find_trace_processor  # noqa: E402
from tracer.query.processor import start_trace_processor  # noqa: E402

TARGET = 0.25
SQL = "SELECT COUNT(*) AS n FROM slice"


def _trace(folder: Path) -> Path:
    """A small trace: 1000 slices on 4 tracks."""
    path = folder / "small.perfetto-trace"
    with TraceWriter(path) as w:
        tracks = [w.thread_track(1, 10 + i, f"worker {i}") for i in range(4)]
        for i in range(1000):
            track = tracks[i % 4]
            w.begin(track, f"task {i % 7}", 1000 * i)
            w.end(track, 1000 * i + 900)
    return path


def _timed(start: Callable[[], Any]) -> float:
    """Seconds from nothing to one query's answer, the server stopped."""
    t = time.perf_counter()
    tp = start()
    try:
        assert int(tp.query(SQL).as_pandas_dataframe()["n"][0]) == 1000
    finally:
        tp.close()
    return time.perf_counter() - t


def _tracer(trace: Path, binary: str) -> float:
    return _timed(lambda: start_trace_processor(trace, binary))


def _package(trace: Path, binary: str) -> float:
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    config = TraceProcessorConfig(bin_path=binary)
    return _timed(lambda: TraceProcessor(trace=str(trace), config=config))


def _cli(trace: Path, binary: str) -> float:
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tracer", "query", str(trace), "SELECT 1"],
        check=True, capture_output=True, cwd=ROOT,
        env={**os.environ, "TRACE_PROCESSOR_PATH": binary},
    )
    return time.perf_counter() - t


def _show(name: str, times: list[float]) -> float:
    median = statistics.median(times)
    print(f"{name:<44} {median * 1000:8.1f} ms  [{min(times) * 1000:.1f}-{max(times) * 1000:.1f}]")
    return median


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="runs of each (default 10)")
    args = parser.parse_args()
    binary = find_trace_processor()
    with tempfile.TemporaryDirectory() as folder:
        trace = _trace(Path(folder))
        _tracer(trace, binary)  # warm: the binary and the package's imports in the page cache
        _package(trace, binary)
        ours: list[float] = []
        theirs: list[float] = []
        for i in range(args.repeats):
            pair = [(ours, _tracer), (theirs, _package)]
            for times, run in pair if i % 2 == 0 else pair[::-1]:
                times.append(run(trace, binary))
        cli = [_cli(trace, binary) for _ in range(max(3, args.repeats // 2))]
    print(f"trace_processor {binary}; {args.repeats} repeats, interleaved")
    a = _show("tracer's start, load, one query, stop", ours)
    b = _show("the perfetto package's start, load, query, stop", theirs)
    _show("`tracer query TRACE 'SELECT 1'` (a fresh Python)", cli)
    ratio = a / b
    ok = ratio <= TARGET
    print(f"tracer / package: {ratio:.3f} (target <= {TARGET}): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

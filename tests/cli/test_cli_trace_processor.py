"""A trace_processor binary that does not start is said to be the binary's fault, not the
trace's, on the command line (``tracer query``, and ``tracer summary``'s fallback)."""

from __future__ import annotations

from pathlib import Path

from test_cli import assert_one_line_error, no_binary_env, tracer

from tracer.format import TraceWriter


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "some.perfetto-trace"
    with TraceWriter(path) as w:
        track = w.thread_track(1, 2, "worker")
        w.begin(track, "task", 10)
        w.end(track, 20)
    return path


def test_a_binary_that_does_not_start_is_not_blamed_on_the_trace(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    env = {**no_binary_env(tmp_path), "TRACE_PROCESSOR_PATH": "/bin/true"}
    line = assert_one_line_error(
        tracer("query", trace, "select 1", env=env),
        "trace_processor (/bin/true) failed to start: point TRACE_PROCESSOR_PATH (or "
        "--trace-processor) at a working trace_processor_shell binary",
    )
    assert "could not load" not in line and str(trace) not in line, line
    summary = tracer("summary", trace, env=env)
    assert summary.returncode == 0, summary.stderr
    warning = summary.stderr.splitlines()[0]
    assert warning.startswith("tracer: warning: trace_processor (/bin/true) failed to start: "
                              "point TRACE_PROCESSOR_PATH"), warning
    assert warning.endswith("/releases); used tracer's reader instead"), warning
    assert "could not load" not in warning and ".;" not in warning, warning

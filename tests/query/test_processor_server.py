"""The trace_processor server tracer starts for a query: the perfetto package's own
TraceProcessor on the outside, a server tracer owns underneath, which never outlives it.

tracer starts the binary itself (the perfetto package waited a second before asking a
starting server whether it was up: a second a query); what the user holds is still the
package's ``TraceProcessor``, and whatever way it ends (closed, a trace it cannot load,
garbage-collected, a binary that never answers), no trace_processor is left running.
How much quicker a start is: benchmarks/bench_query_start.py.
"""

from __future__ import annotations

import gc
import os
import signal
import stat
import sys
from pathlib import Path

import pytest
from test_query_engines import no_binary  # noqa: F401 (a fixture)

from tracer.format import TraceWriter
from tracer.query import TraceProcessorError
from tracer.query.processor import start_trace_processor


def _children() -> set[int]:
    """This process's children that are trace_processor binaries (or stand-ins for one)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and b"trace_processor" in cmdline:
            found.add(int(entry.name))
    return found


def _never_serving(tmp_path: Path, first: str = "") -> Path:
    """A stand-in binary that runs (after ``first``) and never serves: a Python asleep, its
    command line naming trace_processor so that :func:`_children` sees it."""
    fake = tmp_path / "trace_processor_shell"
    fake.write_text(f"#!/bin/sh\n{first}exec {sys.executable} -c "
                    "'import time; time.sleep(60)' trace_processor_stand_in\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "run.perfetto-trace"
    with TraceWriter(path) as w:
        track = w.thread_track(1, 2, "worker")
        w.begin(track, "task", 10)
        w.end(track, 20)
    return path


def test_a_started_processor_is_the_packages_and_closing_it_stops_its_server(
    tmp_path: Path, trace_processor_bin: str
) -> None:
    from perfetto.trace_processor import TraceProcessor

    before = _children()
    tp = start_trace_processor(_trace(tmp_path), trace_processor_bin)
    try:
        assert isinstance(tp, TraceProcessor)
        rows = tp.query("SELECT name, dur FROM slice").as_pandas_dataframe()
        assert rows.to_dict("records") == [{"name": "task", "dur": 10}]
        (server,) = _children() - before
    finally:
        tp.close()
    assert server not in _children(), "trace_processor outlived its close()"
    tp.close()  # a second close does nothing


def test_a_processor_dropped_without_close_stops_its_server(
    tmp_path: Path, trace_processor_bin: str
) -> None:
    before = _children()
    tp = start_trace_processor(_trace(tmp_path), trace_processor_bin)
    (server,) = _children() - before
    del tp
    gc.collect()
    assert server not in _children()


def test_a_trace_it_cannot_load_leaves_no_server(tmp_path: Path, trace_processor_bin: str) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a trace at all\n")
    before = _children()
    with pytest.raises(TraceProcessorError) as err:
        start_trace_processor(text, trace_processor_bin)
    assert str(err.value).startswith(
        f"trace_processor ({trace_processor_bin}) could not load {text}: "
    ), str(err.value)
    assert _children() == before


def test_a_binary_that_never_answers_is_stopped_and_blamed(
    no_binary: None, tmp_path: Path  # noqa: F811
) -> None:
    """A binary that runs but never serves (another program of that name, a hung start):
    after load_timeout, the binary's fault, said with what it printed, and stopped."""
    fake = _never_serving(tmp_path, "echo 'listening, honest' >&2\n")
    before = _children()
    with pytest.raises(TraceProcessorError) as err:
        start_trace_processor(_trace(tmp_path), str(fake), load_timeout=1)
    assert str(err.value).startswith(
        f"trace_processor ({fake}) failed to start (listening, honest): point "
    ), str(err.value)
    assert _children() == before, "the binary that never answered is still running"


def test_a_silent_binary_that_never_answers_says_so(
    no_binary: None, tmp_path: Path  # noqa: F811
) -> None:
    fake = _never_serving(tmp_path)
    with pytest.raises(TraceProcessorError) as err:
        start_trace_processor(_trace(tmp_path), str(fake), load_timeout=1)
    message = str(err.value)
    assert message.startswith(f"trace_processor ({fake}) failed to start (no answer on "
                              "127.0.0.1:"), message
    assert " within 1 s): point TRACE_PROCESSOR_PATH" in message, message


def test_ctrl_c_while_it_starts_leaves_no_server(
    no_binary: None, tmp_path: Path  # noqa: F811
) -> None:
    """The server runs in a session of its own (as the perfetto package starts it): the
    terminal's Ctrl-C reaches tracer only, which must stop it on its way out."""
    fake = _never_serving(tmp_path)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    before = _children()
    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            start_trace_processor(_trace(tmp_path), str(fake), load_timeout=30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert _children() == before, "Ctrl-C left the server running"


def test_verbose_lets_the_servers_log_through_and_keeps_stdout_clean(
    tmp_path: Path, trace_processor_bin: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """``QueryConfig(verbose=True)`` shows trace_processor's log on stderr; stdout is the
    caller's (`tracer query` writes its answers there)."""
    tp = start_trace_processor(_trace(tmp_path), trace_processor_bin, verbose=True)
    try:
        tp.query("SELECT COUNT(*) FROM slice")
    finally:
        tp.close()
    out, err = capfd.readouterr()
    assert out == ""
    assert "HTTP server" in err, err

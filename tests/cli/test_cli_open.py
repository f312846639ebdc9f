"""``python -m tracer open TRACE``: serves the file once on 127.0.0.1:9001, as the UI expects."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
UI = "https://ui.perfetto.dev"


def start(trace: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tracer", "open", str(trace), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ},
    )


def fetch(path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:9001{path}", method=method, headers={"Origin": UI},
        data=b"{}" if method == "POST" else None,
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        with err:  # close our end first, as a browser does
            return err.code, dict(err.headers), err.read()


def url_in(link: str) -> str:
    """The trace's URL in a UI link, as the UI reads it: the ``url=`` argument of the
    query in its fragment (``#!/?url=...&...``), decoded once."""
    fragment = urlsplit(link).fragment
    assert fragment.startswith("!/?"), link
    args = dict(arg.split("=", 1) for arg in fragment[3:].split("&"))
    return unquote(args["url"])


def as_a_browser_fetches(url: str) -> str:
    """The path a browser requests for ``url``: up to a '#', what it may not send as it
    is (a space, non-ASCII) percent-encoded, a '%' left as it is."""
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc) == ("http", "127.0.0.1:9001"), url
    path = quote(parts.path, safe="/%:@!$&'()*+,;=")
    return path + (f"?{quote(parts.query, safe='/%:@!$&()*+,;=?')}" if parts.query else "")


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "my run.perfetto-trace"  # a space: served under a safe name
    # A few real-looking packet records (the command only checks the first byte).
    path.write_bytes(b"\x0a\x02\x50\x01" * 1000)
    return path


def _bindable() -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", 9001))
        except OSError:
            return False
    return True


@pytest.fixture
def port_free() -> Iterator[None]:
    deadline = time.monotonic() + 70  # connections another run left in TIME_WAIT expire in 60 s
    while not _bindable():
        if time.monotonic() > deadline:
            pytest.skip("port 9001 is in use on this machine")
        time.sleep(0.5)
    yield


def test_serves_the_trace_once_to_the_ui(trace: Path, port_free: None) -> None:
    proc = start(trace, "--timeout", "60")
    try:
        assert proc.stdout is not None
        link = proc.stdout.readline().strip()
        head, commands = link.split("&startupCommands=")
        assert head == (
            f"{UI}/#!/?url=http://127.0.0.1:9001/my_run.perfetto-trace&referrer=open_trace_in_ui"
        )
        served = as_a_browser_fetches(url_in(link))
        assert served == "/my_run.perfetto-trace"
        # The view the UI sets up once loaded (run in the real UI by tests/ui): the run and
        # its scheduler, stages and nodes expanded, the dispatch loop pinned.
        assert [(c["id"], c["args"]) for c in json.loads(unquote(commands))] == [
            ("dev.perfetto.ExpandTracksByRegex", ["^Run ", "name"]),
            ("dev.perfetto.ExpandTracksByRegex", ["^(Scheduler \\(|Stages$|Node )", "name"]),
            ("dev.perfetto.PinTracksByRegex", ["^Dispatch\\ loop$", "name"]),
        ]
        # Bound to 127.0.0.1 only: another loopback address gets no answer.
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.2", 9001)) != 0
        # Anything but the file is 404, the UI's RPC probe included; the server keeps going.
        for path, method in (("/", "GET"), ("/other.perfetto-trace", "GET"), ("/status", "POST"),
                             (served, "POST"), (f"/{quote(trace.name)}", "GET"),
                             ("/../etc/passwd", "GET")):
            status, _, _ = fetch(path, method)
            assert status == 404, (path, method)
        assert proc.poll() is None
        status, headers, body = fetch(served)
        assert status == 200
        assert headers["Access-Control-Allow-Origin"] == UI
        assert headers["Cache-Control"] == "no-cache"
        assert body == trace.read_bytes()
        # Served once: it exits, successfully.
        assert proc.wait(timeout=10) == 0
        with pytest.raises(urllib.error.URLError):
            fetch(served)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.mark.parametrize("name", [
    "my trace #1 %.perfetto-trace", "a?b&c=d+e %41.perfetto-trace",
])
def test_the_link_serves_a_file_of_any_name(tmp_path: Path, name: str, port_free: None) -> None:
    """The UI decodes the url= argument of its own URL once: the name in it must come out
    of that a path the server serves ('#' ends a URL's path, '%' starts an escape, '?'
    a query, '&' the next argument of the link)."""
    trace = tmp_path / name
    trace.write_bytes(b"\x0a\x02\x50\x01" * 1000)
    proc = start(trace, "--timeout", "60")
    try:
        assert proc.stdout is not None
        link = proc.stdout.readline().strip()
        status, _, body = fetch(as_a_browser_fetches(url_in(link)))
        assert status == 200, (link, url_in(link))
        assert body == trace.read_bytes()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_times_out(trace: Path, port_free: None) -> None:
    started = time.monotonic()
    proc = start(trace, "--timeout", "1")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert time.monotonic() - started < 20
    lines = [line for line in err.splitlines() if line.startswith("tracer: error:")]
    assert len(lines) == 1 and "timed out after 1 s" in lines[0]
    assert "Traceback" not in err


def test_port_busy(trace: Path, port_free: None) -> None:
    with socket.socket() as holder:
        # As port_free's check does: a connection left in TIME_WAIT on 9001 (the UI
        # tests' trace_processor, a serve just before) must not keep it from listening.
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 9001))
        holder.listen()
        proc = start(trace, "--timeout", "5")
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert out == ""
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith("tracer: error: port 9001 on 127.0.0.1 is busy")


def test_bad_files(tmp_path: Path) -> None:
    for path, needle in ((tmp_path / "nope", "no such trace file"),
                         (tmp_path, "folder with no trace")):
        proc = start(path)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 1
        assert out == ""
        assert err.strip() == err.strip().splitlines()[0]
        assert needle in err


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e300", "86401", "-1", "soon"])
def test_a_timeout_out_of_range_is_a_usage_error(
    trace: Path, value: str, port_free: None
) -> None:
    """Not a traceback from the socket wait (OverflowError, ValueError): argparse's exit 2."""
    proc = start(trace, f"--timeout={value}")
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # it took the value and serves: stop it, free the port
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, err
    assert out == ""
    assert "Traceback" not in err
    assert err.startswith("usage: ")
    assert err.strip().splitlines()[-1].startswith("tracer open: error: argument --timeout: ")


def test_the_largest_timeout_is_served(trace: Path, port_free: None) -> None:
    proc = start(trace, "--timeout", "86400")
    try:
        assert proc.stderr is not None
        assert "for up to 86400 s" in proc.stderr.readline()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)

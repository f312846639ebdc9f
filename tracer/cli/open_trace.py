"""``tracer open TRACE``: hand the trace to the Perfetto UI, the way it expects.

The UI (https://ui.perfetto.dev) may fetch a trace from exactly one local
origin: ``http://127.0.0.1:9001`` (its Content-Security-Policy allows no
other). So this serves the one file there, with CORS for the UI's origin
only, answers 404 to anything else (the UI's ``POST /status`` probe too),
exits once the file has been served, and prints the deep link that makes the
UI fetch it. Like Perfetto's own ``tools/open_trace_in_ui``.

The link also carries the UI's ``startupCommands`` (:data:`STARTUP_COMMANDS`),
which run once the trace is loaded: they open the run, its scheduler, its
stages and its nodes, and pin the dispatch loop to the top, so the first
view shows the loop and what it launched. Only commands on the UI's
startup allowlist run (pinning and expanding tracks by name are; selecting
a slice is not).

The file is served under :func:`served_name`, its name with anything but
letters, digits, ``.``, ``_`` and ``-`` made ``_``: the UI takes the trace's
URL from a ``url=`` argument in its own URL's fragment and decodes it, so a
name with ``#``, ``%``, ``?``, ``&`` or a space would not survive the trip.

On a remote machine (a Ray head node), forward the port first:
``ssh -L 9001:127.0.0.1:9001 HOST``, then open the link locally.
"""

from __future__ import annotations

import argparse
import errno
import http.server
import json
import math
import re
import shutil
import sys
import time
import webbrowser
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from tracer.cli._common import trace_in, warn
from tracer.errors import TracerError
from tracer.query import check_trace_file, framing_warning
from tracer.ray import layout as L

HELP = "open the trace in the Perfetto UI (serves it once on 127.0.0.1:9001)"

HOST = "127.0.0.1"
PORT = 9001
UI_ORIGIN = "https://ui.perfetto.dev"
_CLIENT_CLOSE_WAIT_S = 1.0
MAX_TIMEOUT_S = 86400.0

#: What the UI runs once the trace is loaded (its ``startupCommands`` URL
#: argument; ids and arguments as in Perfetto v58's TrackUtils plugin, each
#: on its startup allowlist): expand the run's root, then its scheduler,
#: stages and nodes, and pin the dispatch loop.
STARTUP_COMMANDS: list[dict[str, Any]] = [
    {"id": "dev.perfetto.ExpandTracksByRegex",
     "args": [f"^{re.escape(L.RUN_TRACK_PREFIX)} ", "name"]},
    {"id": "dev.perfetto.ExpandTracksByRegex",
     "args": [f"^({re.escape(L.SCHEDULER_PROCESS)} \\(|{re.escape(L.STAGES_TRACK)}$"
              f"|{re.escape(L.NODE_PROCESS_PREFIX)} )", "name"]},
    {"id": "dev.perfetto.PinTracksByRegex",
     "args": [f"^{re.escape(L.DISPATCH_LOOP_THREAD)}$", "name"]},
]

__all__ = [
    "HOST", "PORT", "STARTUP_COMMANDS", "UI_ORIGIN", "add_parser", "run", "served_name",
    "startup_query", "ui_link",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_FALLBACK_NAME = "trace.perfetto-trace"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "open",
        help=HELP,
        description=(
            "Serve TRACE once on http://127.0.0.1:9001 (the only address the Perfetto UI may "
            "fetch from) and print the link that opens it in https://ui.perfetto.dev. Exits "
            "after the UI has fetched it. On a remote machine, forward the port first: "
            "ssh -L 9001:127.0.0.1:9001 HOST."
        ),
    )
    parser.add_argument(
        "trace", metavar="TRACE",
        help="the trace file to open, or a folder of traces (its newest is opened)",
    )
    parser.add_argument(
        "--timeout", type=_timeout, default=300.0,
        help=(
            "seconds to wait for the UI to fetch the trace (default 300; at most "
            f"{MAX_TIMEOUT_S:g}, a day; 0 waits forever)"
        ),
    )
    parser.add_argument(
        "--browser", action="store_true", help="also open the link in a web browser here"
    )
    parser.set_defaults(run=run)


def _timeout(text: str) -> float:
    """--timeout: finite seconds in [0, MAX_TIMEOUT_S]; larger ones overflow the socket wait."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or not 0 <= value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"must be between 0 (wait forever) and {MAX_TIMEOUT_S:g} s (a day), got {text}"
        )
    return value


def startup_query() -> str:
    """The ``startupCommands`` argument of a UI link (URL-encoded JSON)."""
    return "startupCommands=" + quote(json.dumps(STARTUP_COMMANDS, separators=(",", ":")), safe="")


def served_name(name: str) -> str:
    """The name a file is served under: ``name`` with every character but ASCII letters,
    digits, ``.``, ``_`` and ``-`` replaced by ``_`` (``my run #1.perfetto-trace`` is
    ``my_run__1.perfetto-trace``), which no URL encoding or decoding changes."""
    safe = _UNSAFE.sub("_", name)
    return safe if safe.strip(".") else _FALLBACK_NAME


def ui_link(name: str) -> str:
    """The Perfetto UI deep link that fetches ``name`` (a :func:`served_name`) from
    127.0.0.1:9001 and runs :data:`STARTUP_COMMANDS` once it is loaded."""
    return (
        f"{UI_ORIGIN}/#!/?url=http://{HOST}:{PORT}/{quote(name)}&referrer=open_trace_in_ui"
        f"&{startup_query()}"
    )


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _OneFileServer
    server_version = "tracer"
    sys_version = ""

    def do_GET(self) -> None:
        srv = self.server
        if unquote(urlsplit(self.path).path) != "/" + srv.name:
            self._not_found()
            return
        size = srv.path.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.send_header("Access-Control-Allow-Origin", UI_ORIGIN)
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        try:
            with srv.path.open("rb") as f:
                shutil.copyfileobj(f, self.wfile)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return  # the browser gave up; keep waiting for another try
        srv.served = True

    def _not_found(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.close_connection = True

    do_POST = _not_found
    do_PUT = _not_found
    do_DELETE = _not_found
    do_PATCH = _not_found
    do_OPTIONS = _not_found
    do_HEAD = _not_found

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the command says what matters


class _OneFileServer(http.server.HTTPServer):
    # SO_REUSEADDR: a port left in TIME_WAIT by the last run is free; on Linux a port
    # another socket listens on still fails to bind (EADDRINUSE), as it must.
    allow_reuse_address = True

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = served_name(path.name)
        self.served = False
        super().__init__((HOST, PORT), _Handler)

    def shutdown_request(self, request: Any) -> None:
        """Let the client close first (every response has a Content-Length).

        The side that closes a TCP connection first keeps it in TIME_WAIT for a
        minute, and some kernels (gVisor, for one) then refuse to bind the port
        again even with SO_REUSEADDR: a second ``tracer open`` would find 9001
        busy. So wait (briefly) for the browser's close before closing ours.
        """
        try:
            request.settimeout(_CLIENT_CLOSE_WAIT_S)
            while request.recv(65536):
                pass
        except OSError:
            pass
        self.close_request(request)


def run(args: argparse.Namespace) -> int:
    path = check_trace_file(trace_in(args.trace)).resolve()
    damage = framing_warning(path)
    if damage is not None:
        warn(damage)
    try:
        server = _OneFileServer(path)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise TracerError(
                f"port {PORT} on {HOST} is busy (another `tracer open`, or trace_processor_shell "
                f"--httpd?): stop it and try again; the Perfetto UI fetches traces only from "
                f"{HOST}:{PORT}"
            ) from None
        raise TracerError(f"cannot listen on {HOST}:{PORT}: {exc.strerror or exc}") from None
    link = ui_link(server.name)
    with server:
        print(link, flush=True)
        wait = "until the UI fetches it" if not args.timeout else f"for up to {args.timeout:g} s"
        print(
            f"tracer: serving {path} once as http://{HOST}:{PORT}/{server.name} {wait}; open "
            "the link above in a browser on this machine (Ctrl-C to stop)",
            file=sys.stderr, flush=True,
        )
        if args.browser and not webbrowser.open(link):
            warn("no web browser could be started here: open the link yourself")
        deadline = time.monotonic() + args.timeout if args.timeout else None
        while not server.served:
            if deadline is None:
                server.timeout = None
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TracerError(
                        f"timed out after {args.timeout:g} s: the Perfetto UI did not fetch the "
                        "trace (was the link opened in a browser on this machine?)"
                    )
                server.timeout = left
            server.handle_request()
    print("tracer: the Perfetto UI has the trace; done", file=sys.stderr)
    return 0

"""Finding and starting trace_processor (the perfetto package's Python API).

The binary comes from, in order: an explicit path, ``$TRACE_PROCESSOR_PATH``,
the binary the perfetto package caches after its first download
(``~/.local/share/perfetto/prebuilts``), then ``trace_processor_shell`` on
``PATH``. tracer never lets the perfetto package download one: on machines
without internet that download fails slowly and unclearly.

tracer starts the binary itself, as the HTTP server the perfetto package would
start, and hands the package its address: the package asks a server it started
whether it is up once a second, so that every start took a second (a server is up
in ~20 ms), the most of what a ``tracer query`` or ``tracer summary`` took.
"""

from __future__ import annotations

import functools
import inspect
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from tracer.query.errors import TraceProcessorError, TraceProcessorNotFoundError

__all__ = [
    "ENV_VAR", "NOT_FOUND_HELP", "START_HELP", "find_trace_processor", "start_trace_processor",
]

ENV_VAR = "TRACE_PROCESSOR_PATH"

_GET_ONE = (
    "download one on a machine with internet access from "
    "https://get.perfetto.dev/trace_processor, or take the prebuilt of a Perfetto release at "
    "https://github.com/google/perfetto/releases"
)
_WITHOUT_IT = (
    "`tracer summary` and `tracer memory` work without it (with --engine reader, or the "
    "default --engine auto)"
)

NOT_FOUND_HELP = f"set {ENV_VAR} to a trace_processor_shell binary ({_GET_ONE}); {_WITHOUT_IT}"

#: What to do about a binary that does not start.
START_HELP = (
    f"point {ENV_VAR} (or --trace-processor) at a working trace_processor_shell binary "
    f"({_GET_ONE})"
)



def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _package_prebuilt() -> Path | None:
    """The trace_processor_shell the perfetto package has cached, if it ever downloaded one."""
    try:
        from perfetto.prebuilts.manifests.trace_processor_shell import (
            TRACE_PROCESSOR_SHELL_MANIFEST,
        )
    except Exception:  # an older or newer perfetto package
        return None
    plat = sys.platform.lower()
    machine = platform.machine().lower()
    for entry in TRACE_PROCESSOR_SHELL_MANIFEST:
        if entry.get("platform") != plat or machine not in entry.get("machine", []):
            continue
        name = str(entry.get("file_name", ""))
        sha = str(entry.get("sha256", ""))
        if not name or not sha:
            return None
        root, ext = os.path.splitext(name)
        folder = Path.home() / ".local" / "share" / "perfetto" / "prebuilts"
        path = folder / f"{root}-{sha[:16]}{ext}"
        return path if _executable(path) else None
    return None


def find_trace_processor(explicit: str | os.PathLike[str] | None = None) -> str:
    """The trace_processor binary to use; :class:`TraceProcessorNotFoundError` if there is none.

    An explicit path or ``$TRACE_PROCESSOR_PATH`` that is not an executable
    file is an error (not silently skipped).
    """
    for source, value in (("explicit", explicit), (ENV_VAR, os.environ.get(ENV_VAR))):
        if value is None or str(value) == "":
            continue
        path = Path(value).expanduser()
        # Name the place the path came from, and give the advice that fits it.
        if source == ENV_VAR:
            given, fix = f"{ENV_VAR}={value}", NOT_FOUND_HELP
        else:
            given = f"trace_processor binary {value} (--trace-processor / trace_processor_path)"
            fix = f"give the path of a trace_processor_shell binary ({_GET_ONE}); {_WITHOUT_IT}"
        if not path.exists():
            raise TraceProcessorNotFoundError(f"{given}: no such file; {fix}")
        if path.is_dir():
            raise TraceProcessorNotFoundError(
                f"{given} is a folder, not the trace_processor_shell binary; {fix}"
            )
        if not _executable(path):
            raise TraceProcessorNotFoundError(f"{given} is not an executable file (chmod +x it?)")
        return str(path)
    cached = _package_prebuilt()
    if cached is not None:
        return str(cached)
    on_path = shutil.which("trace_processor_shell")
    if on_path:
        return on_path
    raise TraceProcessorNotFoundError(f"no trace_processor binary found: {NOT_FOUND_HELP}")


def start_trace_processor(trace: Path, bin_path: str, *, load_timeout: float = 30,
                          verbose: bool = False) -> Any:
    """Start trace_processor on ``trace``; :class:`TraceProcessorError` if it fails.

    What it returns is the perfetto package's ``TraceProcessor``, connected to a
    server of its own: closing it stops that server.
    """
    server = _Server.start(bin_path, load_timeout, verbose)
    try:
        return _owned_processor_class()(str(trace), server)
    except Exception as exc:
        server.stop()
        raise TraceProcessorError(
            f"trace_processor ({bin_path}) could not load {trace}: {one_line(exc).rstrip('.')}"
        ) from exc
    except BaseException:  # Ctrl-C (or SIGTERM, in the CLI) during the load
        server.stop()  # in a session of its own, the signal did not reach it
        raise


class _Server:
    """trace_processor_shell as an HTTP server on 127.0.0.1, started and stopped by tracer.

    Started as the perfetto package starts it (``-D --http-port PORT
    --no-ftrace-raw``, in a session of its own), on a port the system had free a
    moment before: the package's way, and its small race with another program
    taking that port in between.
    """

    def __init__(self, process: subprocess.Popen[bytes], address: str,
                 stderr: IO[bytes] | None) -> None:
        self.process = process
        self.address = address
        self._stderr = stderr

    @classmethod
    def start(cls, bin_path: str, load_timeout: float, verbose: bool) -> _Server:
        """A server that answers; :class:`TraceProcessorError` (the binary's fault) if none."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        # Kept as long as the server runs (what it said if it stops), closed by stop().
        # Verbose lets its log (stderr) through; stdout is never its: `tracer query`
        # writes its answers there.
        stderr = None if verbose else tempfile.TemporaryFile()  # noqa: SIM115
        try:
            process = subprocess.Popen(
                [bin_path, "-D", "--http-port", str(port), "--no-ftrace-raw"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                start_new_session=True,
            )
        except OSError as exc:
            if stderr is not None:
                stderr.close()
            raise _failed(bin_path, exc.strerror or "") from exc
        server = cls(process, f"127.0.0.1:{port}", stderr)
        try:
            server._wait_until_up(bin_path, load_timeout)
        except BaseException:  # its own failures stopped it already; Ctrl-C did not
            server.stop()
            raise
        return server

    def _wait_until_up(self, bin_path: str, load_timeout: float) -> None:
        # Not at import: `tracer --help` does not need them (~25 ms).
        import http.client
        import urllib.request

        deadline = time.monotonic() + max(1.0, load_timeout)
        pause = 0.005
        while True:
            if self.process.poll() is not None:
                said = self._said()
                self.stop()
                raise _failed(bin_path, said)
            try:
                with urllib.request.urlopen(f"http://{self.address}/status", timeout=5) as r:
                    r.read()
                return
            except (OSError, http.client.HTTPException):  # urllib's URLError is an OSError
                pass
            if time.monotonic() > deadline:
                said = self._said() or f"no answer on {self.address} within {load_timeout:g} s"
                self.stop()
                raise _failed(bin_path, said)
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _said(self) -> str:
        """The first line the binary wrote on stderr (when it was kept), at most 200 characters."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read(64 << 10).decode("utf-8", "replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            return ""
        return lines[0] if len(lines[0]) <= 200 else lines[0][:200] + "..."

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s); calling it again does nothing."""
        process = self.process
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def _failed(bin_path: str, said: str) -> TraceProcessorError:
    """The binary did not start (it starts as a server before it is given the trace: the
    trace has nothing to do with this, the binary does)."""
    return TraceProcessorError(
        f"trace_processor ({bin_path}) failed to start{f' ({said})' if said else ''}: "
        f"{START_HELP}"
    )


@functools.cache
def _owned_processor_class() -> type:
    """The perfetto package's TraceProcessor, connected to a :class:`_Server` it stops when
    closed (the package imported on first use: `tracer summary --engine reader` never pays
    for it)."""
    from perfetto.trace_processor import TraceProcessor

    # `remote` since perfetto 0.59; `addr` (deprecated since) before it.
    where = "remote" if "remote" in inspect.signature(TraceProcessor.__init__).parameters \
        else "addr"

    class OwnedTraceProcessor(TraceProcessor):  # type: ignore[misc]
        def __init__(self, trace: str, server: _Server) -> None:
            # Set first: the package closes the processor when the trace fails to load.
            self._tracer_server = server
            super().__init__(trace=trace, **{where: server.address})

        def close(self) -> None:
            try:
                super().close()
            finally:
                server = getattr(self, "_tracer_server", None)
                if server is not None:
                    server.stop()

    return OwnedTraceProcessor


def one_line(exc: BaseException) -> str:
    """An exception's message on one line.

    trace_processor's SQL errors span many lines (a traceback of the SQL, a
    caret, then the reason): the reason is the last line.
    """
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].startswith("Traceback"):
        return lines[-1]
    return lines[0]

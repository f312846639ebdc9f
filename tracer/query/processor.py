"""Finding and starting trace_processor (the perfetto package's Python API).

The binary comes from, in order: an explicit path, ``$TRACE_PROCESSOR_PATH``,
the binary the perfetto package caches after its first download
(``~/.local/share/perfetto/prebuilts``), then ``trace_processor_shell`` on
``PATH``. tracer never lets the perfetto package download one: on machines
without internet that download fails slowly and unclearly.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

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
    """Start trace_processor on ``trace``; :class:`TraceProcessorError` if it fails."""
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    config = TraceProcessorConfig(
        bin_path=bin_path, load_timeout=max(1, int(load_timeout)), verbose=verbose
    )
    try:
        return TraceProcessor(trace=str(trace), config=config)
    except Exception as exc:
        if _failed_to_start(exc, bin_path):
            # The binary starts as a server before it is given the trace: the trace
            # has nothing to do with this, the binary does.
            said = _its_words(exc)
            raise TraceProcessorError(
                f"trace_processor ({bin_path}) failed to start"
                f"{f' ({said})' if said else ''}: {START_HELP}"
            ) from exc
        raise TraceProcessorError(
            f"trace_processor ({bin_path}) could not load {trace}: {one_line(exc).rstrip('.')}"
        ) from exc


#: What to do about a binary that does not start.
START_HELP = (
    f"point {ENV_VAR} (or --trace-processor) at a working trace_processor_shell binary "
    f"({_GET_ONE})"
)


def _failed_to_start(exc: BaseException, bin_path: str) -> bool:
    """Whether ``exc`` is the binary not starting (rather than it failing on the trace).

    The perfetto package starts trace_processor as an HTTP server, without the trace,
    and says "Trace processor failed to start" when it exits or never answers; a file
    the system cannot run (another architecture, no shebang) fails in Popen with an
    OSError naming it.
    """
    if isinstance(exc, OSError) and exc.filename is not None:
        return str(exc.filename) == str(bin_path)
    return "failed to start" in str(exc).lower()


def _its_words(exc: BaseException) -> str:
    """What the binary printed on stderr (the perfetto package's message carries it), or
    the system's reason it could not run; '' when there is nothing."""
    if isinstance(exc, OSError):
        return exc.strerror or ""
    text = str(exc)
    _, sep, rest = text.partition("stderr:")
    if not sep:
        return ""
    lines = [line.strip() for line in rest.splitlines() if line.strip()]
    if not lines or lines[0].startswith("If this is a slow machine"):
        return ""
    said = lines[0]
    return said if len(said) <= 200 else said[:200] + "..."


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

"""What opening a trace takes, without pandas or the engines: the query layer's light part.

:class:`QueryConfig` and :func:`check_trace_file` are what a command line
needs before it answers anything (its options, a quick check of the file),
so they live apart from :class:`~tracer.query.TraceQuery`, whose imports
(pandas, the reader, the analyses) take ~0.4 s: ``tracer --help``,
``tracer open`` and ``tracer convert`` do not pay for them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Literal

from tracer.errors import TraceReadError

__all__ = [
    "DEFAULT_HEADROOM", "ENGINES", "Engine", "QueryConfig", "check_trace_file", "framing_warning",
]

#: How far above the largest measured peak a suggested ``memory=`` request goes
#: (:func:`tracer.query.suggest.memory_suggestions`).
DEFAULT_HEADROOM = 1.25

Engine = Literal["reader", "trace_processor", "auto"]
ENGINES: tuple[str, ...] = ("reader", "trace_processor", "auto")


@dataclasses.dataclass(frozen=True)
class QueryConfig:
    """How :class:`TraceQuery` answers.

    ``engine`` computes the ready-made analyses:

    * ``"auto"`` (default): trace_processor when a binary can be found and
      starts, else the reader; :meth:`TraceQuery.warnings` says why when a
      binary was found but does not start, or when ``trace_processor_path``
      or ``$TRACE_PROCESSOR_PATH`` names one that is missing or not
      executable (no binary anywhere falls back quietly);
    * ``"trace_processor"``: with the SQL files of ``tracer/query/sql`` in
      trace_processor (fails if no binary can be found);
    * ``"reader"``: in Python, streaming the trace with
      :func:`tracer.format.scan_trace` and keeping a row per task and per
      execution; needs nothing else, works everywhere.

    Both engines return the same columns and numbers. :meth:`TraceQuery.query`
    (arbitrary SQL) always needs trace_processor, whatever the engine.

    ``trace_processor_path`` is the trace_processor_shell binary; by default
    ``$TRACE_PROCESSOR_PATH``, then the binary the perfetto package cached on
    an earlier download, then ``trace_processor_shell`` on ``PATH``.
    ``load_timeout`` is how long (s) trace_processor may take to start;
    ``verbose`` lets its log (stderr) through.
    """

    engine: Engine = "auto"
    trace_processor_path: str | None = None
    load_timeout: float = 30.0
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")


def check_trace_file(path: str | os.PathLike[str]) -> Path:
    """A quick check that ``path`` is a readable Perfetto trace file (plain or gzip).

    For tools that hand the file to something else (trace_processor, the
    Perfetto UI), whose errors are vaguer. Raises
    :class:`~tracer.errors.TraceReadError`; returns the path. Whether the
    file is whole is :func:`framing_warning`'s business.
    """
    path = Path(path)
    if not path.exists():
        raise TraceReadError(f"no such trace file: {path}")
    if not path.is_file():
        raise TraceReadError(f"not a file: {path}")
    try:
        with path.open("rb") as f:
            head = f.read(2)
    except OSError as exc:
        raise TraceReadError(f"cannot read trace file {path}: {exc.strerror or exc}") from exc
    if not head:
        raise TraceReadError(f"trace file {path} is empty")
    if head[:1] != b"\x0a" and head != b"\x1f\x8b":
        from tracer.format import check_framing

        check_framing(path)  # raises, saying what the file looks like instead
        raise TraceReadError(  # pragma: no cover - check_framing raised
            f"{path} is not a Perfetto protobuf trace (it does not start with a packet record)"
        )
    return path


def framing_warning(path: str | os.PathLike[str]) -> str | None:
    """What a reader other than tracer's (trace_processor, the UI) will not say: that the
    file was cut while being written, or is damaged; None when it is whole."""
    from tracer.format import check_framing

    framing = check_framing(path)
    if framing.truncated and framing.records == 0:
        return (
            "the trace is cut before its first complete packet: there is nothing to analyse "
            "(a compressed trace loses the bundle it was writing when a run dies)"
        )
    if framing.truncated:
        return (
            f"the trace is truncated (cut while being written?): only its first "
            f"{framing.complete} of {framing.size} bytes ({framing.records} complete records) "
            "can be read"
        )
    if framing.damaged_at is not None:
        return (
            f"the trace is damaged at byte {framing.damaged_at} of {framing.size}: only what "
            "comes before it can be read"
        )
    return None


#: What a trace file's name ends with, in a folder of them.
TRACE_SUFFIXES = (".perfetto-trace", ".perfetto-trace.gz")


def newest_trace(folder: str | os.PathLike[str]) -> tuple[Path, int]:
    """The newest trace in ``folder`` (by modification time), and how many it holds.

    Traces a process writes by itself go to a folder (``<session>/logs/tracer``,
    ``$TRACER_TRACE_DIR``) under names that carry ids and times: the folder is
    what a user knows. :class:`~tracer.errors.TraceReadError` for a folder with
    none, or one that cannot be listed.
    """
    where = Path(folder).expanduser()
    try:
        found = [p for p in where.iterdir() if p.name.endswith(TRACE_SUFFIXES) and p.is_file()]
    except OSError as exc:
        raise TraceReadError(f"cannot list {folder}: {exc.strerror or exc}") from exc
    if not found:
        raise TraceReadError(
            f"{folder} is a folder with no trace in it (*.perfetto-trace, *.perfetto-trace.gz)"
        )
    return max(found, key=lambda p: (p.stat().st_mtime_ns, p.name)), len(found)


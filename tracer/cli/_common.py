"""What the commands share: trace arguments, opening a TraceQuery, messages."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tracer.query import ENGINES, QueryConfig

if TYPE_CHECKING:
    from tracer.query import TraceQuery

__all__ = [
    "add_trace_args", "bucket_count", "error", "non_negative_int", "open_query", "positive_int",
    "trace_in", "warn",
]

#: What a trace written by tracer is named (plain, or gzip-compressed).


def error(message: str) -> None:
    print(f"tracer: error: {message}", file=sys.stderr)


def warn(message: str) -> None:
    print(f"tracer: warning: {message}", file=sys.stderr)


def _int_at_least(text: str, least: int, most: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    if most is not None and value > most:
        raise argparse.ArgumentTypeError(f"must be at most {most}, got {value}")
    return value


def bucket_count(text: str) -> int:
    """``--buckets``: 1 to :data:`tracer.query.sql.MAX_BUCKETS`."""
    from tracer.query.sql import MAX_BUCKETS

    return _int_at_least(text, 1, MAX_BUCKETS)


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def add_trace_args(parser: argparse.ArgumentParser, *, engine: bool = True) -> None:
    parser.add_argument(
        "trace", metavar="TRACE",
        help="a .perfetto-trace file written by tracer, or a folder of them (its newest is read)",
    )
    if engine:
        parser.add_argument(
            "--engine",
            choices=ENGINES,
            default="auto",
            help=(
                "what computes the analyses: 'auto' (default: trace_processor when a binary "
                "is found and starts, else the reader), 'trace_processor' (the SQL files of "
                "tracer/query/sql in trace_processor; needs a binary) or 'reader' (tracer's own "
                "trace reader: works everywhere, keeps a row per task in memory). Both give "
                "the same numbers."
            ),
        )
    parser.add_argument(
        "--trace-processor",
        metavar="PATH",
        help="trace_processor_shell binary (default: $TRACE_PROCESSOR_PATH, then the one the "
        "perfetto package cached, then trace_processor_shell on PATH)",
    )


def trace_in(given: str) -> str:
    """``given``, or where it is a folder, the newest trace in it (said on stderr):
    see :func:`tracer.query.config.newest_trace`."""
    from pathlib import Path

    from tracer.query.config import newest_trace

    if not Path(given).expanduser().is_dir():
        return given
    newest, count = newest_trace(given)
    more = f" (of {count} there)" if count > 1 else ""
    print(f"tracer: {given} is a folder: reading its newest trace, {newest.name}{more}",
          file=sys.stderr)
    return str(newest)


def _has_something(path: str) -> None:
    """A trace cut before its first whole packet is an error, not empty answers: a script
    would read empty tables and status 0 as a run that did nothing."""
    from tracer.errors import TraceReadError
    from tracer.format import check_framing

    try:
        framing = check_framing(path)
    except TraceReadError:
        return  # not a trace at all: TraceQuery says what it is
    if framing.truncated and framing.records == 0:
        raise TraceReadError(
            f"{path} is cut before its first complete packet: there is nothing in it to "
            "analyse (a finished trace is one compressed bundle, so a copy cut short holds "
            "nothing; a run that dies mid-way keeps what it had written)"
        )


@contextlib.contextmanager
def open_query(args: argparse.Namespace, engine: str | None = None) -> Iterator[TraceQuery]:
    """A TraceQuery for ``args.trace``; prints its warnings (truncation...) on stderr."""
    from tracer.query import TraceQuery

    chosen = engine or getattr(args, "engine", "auto")
    if chosen not in ENGINES:  # argparse's choices keep this from happening
        raise ValueError(f"unknown engine {chosen!r}")
    config = QueryConfig(
        engine=chosen,  # type: ignore[arg-type]
        trace_processor_path=args.trace_processor,
    )
    args.trace = trace_in(args.trace)
    _has_something(args.trace)
    with TraceQuery(args.trace, config) as q:
        for message in q.warnings():
            warn(message)
        yield q

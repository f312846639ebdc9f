"""The ``tracer`` command: answers from a trace on the command line.

::

    tracer summary TRACE        stages, task latency, dispatch loop, workers
    tracer memory TRACE         requested vs actual memory, tasks over their request
    tracer query TRACE SQL      any SQL, in trace_processor
    tracer open TRACE           open the trace in the Perfetto UI
    tracer convert TIMELINE     Ray's timeline (Chrome JSON) as a Perfetto trace

One module per command (``tracer.cli.<command>``), each with ``add_parser``
and ``run``. Errors a user can cause print one line on stderr and exit 1;
usage errors exit 2 (argparse).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from types import FrameType

from tracer.cli import convert, memory, open_trace, query, summary
from tracer.cli._common import error
from tracer.errors import TracerError

__all__ = ["build_parser", "main"]


class _Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a CI job cancelled), raised where the command is
    so that it unwinds like Ctrl-C: a trace_processor it started is stopped, not left
    running on its own (it gets Ctrl-C's SIGINT from the terminal, not our SIGTERM)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; the caller owns signals then
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

_COMMANDS = (summary, memory, query, open_trace, convert)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tracer",
        description="Answers from a Perfetto trace of a Ray task runner.",
        epilog="Run `tracer COMMAND --help` for a command's options.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _COMMANDS:
        module.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 error, 2 usage, 130 interrupted,
    143 terminated by SIGTERM)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if sys.stdout is None:
        # Started with stdout closed (`tracer summary T >&-`): Python has no sys.stdout,
        # and every command's answer would go nowhere. Say so before doing any work.
        error("standard output is closed: there is nowhere to write the answer")
        return 1
    try:
        with _sigterm_unwinds():
            status = args.run(args)
        sys.stdout.flush()
        return int(status or 0)
    except TracerError as exc:
        error(str(exc))
    except _Terminated:
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`tracer summary T | head`): not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as exc:
        error(f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}")
    return 1

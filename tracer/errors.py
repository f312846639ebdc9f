"""Exceptions raised by tracer.

Every error a user can cause is a subclass of :class:`TracerError`, so one
``except TracerError`` is enough to keep tracing problems apart from a job's
own failures.
"""

from __future__ import annotations


class TracerError(Exception):
    """Base class of every error tracer raises on purpose."""


class TraceWriteError(TracerError, OSError):
    """The trace file cannot be created or written (missing folder, no permission, disk full)."""


class TraceWriterClosedError(TracerError, ValueError):
    """An event was written after :meth:`TraceWriter.close`."""


class UnknownTrackError(TracerError, ValueError):
    """An event names a track that this writer never declared."""


class TraceReadError(TracerError, ValueError):
    """The file is not a Perfetto protobuf trace, or is damaged beyond its last packet."""


class TraceOrderError(TracerError):
    """A streaming read (:func:`tracer.format.scan_trace`) met an event written too late.

    The trace itself may be fine: its events on one track are out of
    timestamp order by more than the scan's ``window_ns``. Scan again with a
    larger window (``lateness_ns`` is by how much it was exceeded, at least),
    or with ``window_ns=None``.
    """

    def __init__(self, message: str, *, track_uuid: int, lateness_ns: int) -> None:
        super().__init__(message)
        self.track_uuid = track_uuid
        self.lateness_ns = lateness_ns


class InvalidTracingLevelError(TracerError, ValueError):
    """A tracing level outside 0, 1 and 2 was asked for."""


class InvalidArgumentError(TracerError, ValueError):
    """An argument has the right type but a value tracer cannot use (a bad pid, rank, unit...)."""


class InvalidArgumentTypeError(TracerError, TypeError):
    """An argument has a type tracer cannot use (a name that is not a str, ...)."""


class ValueOutOfRangeError(InvalidArgumentError, OverflowError):
    """A number does not fit the field it goes into (e.g. a counter value beyond int64)."""


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, on Python 3.10 too, and never an error of its own.

    Python 3.10 has no ``add_note``: there the ``__notes__`` list 3.11 would
    make is made by hand (pytest shows it; 3.10's own tracebacks do not). An
    exception that refuses new attributes keeps no note: a note is never
    worth replacing the user's error with another.
    """
    try:
        if hasattr(exc, "add_note"):
            exc.add_note(note)
            return
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
            exc.__notes__ = notes  # type: ignore[attr-defined]  # (mypy checks for 3.10)
        notes.append(note)
    except Exception:
        pass

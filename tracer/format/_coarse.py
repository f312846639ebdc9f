"""Writers whose timestamps are recorded in units coarser than a nanosecond.

``TraceWriter(..., time_unit_ns=1000)`` turns into one of these: timestamps
still come in (and :meth:`now` still returns) ns, and are converted to units
where they enter, so the default (ns) hot path pays nothing for the option.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tracer.format.tracks import CounterTrack, Track
from tracer.format.writer import TraceWriter

__all__: list[str] = []


def _coarse_class(cls: type[TraceWriter]) -> type[TraceWriter]:
    """``cls`` taking ns timestamps into coarser units (a subclass of it, made once)."""
    if cls is TraceWriter:
        return _CoarseTraceWriter
    made = _COARSE_CLASSES.get(cls)
    if made is None:
        made = _COARSE_CLASSES[cls] = type(
            cls.__name__, (cls, _CoarseTraceWriter),  # its methods see ns, as they would
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
    return made


#: Coarse variants of subclasses of TraceWriter, by subclass.
_COARSE_CLASSES: dict[type[TraceWriter], type[TraceWriter]] = {}


class _CoarseTraceWriter(TraceWriter):
    """A :class:`TraceWriter` with ``time_unit_ns`` > 1 (its constructor turns into one).

    Timestamps come in as ns and are converted to units where they enter;
    the base class's hot path and delta chain then work in units, and its
    clock returns units.
    """

    def now(self) -> int:
        return self._clock() * self.time_unit_ns

    def begin(
        self,
        track: Track,
        name: str,
        ts: int | None = None,
        *,
        category: str | None = None,
        args: Mapping[str, Any] | None = None,
        flows: Iterable[int] | None = None,
        terminating_flows: Iterable[int] | None = None,
    ) -> None:
        super().begin(
            track, name, None if ts is None else ts // self.time_unit_ns, category=category,
            args=args, flows=flows, terminating_flows=terminating_flows,
        )

    def end(
        self,
        track: Track,
        ts: int | None = None,
        *,
        args: Mapping[str, Any] | None = None,
        flows: Iterable[int] | None = None,
    ) -> None:
        super().end(
            track, None if ts is None else ts // self.time_unit_ns, args=args, flows=flows
        )

    def instant(
        self,
        track: Track,
        name: str,
        ts: int | None = None,
        *,
        category: str | None = None,
        args: Mapping[str, Any] | None = None,
        flows: Iterable[int] | None = None,
        terminating_flows: Iterable[int] | None = None,
    ) -> None:
        super().instant(
            track, name, None if ts is None else ts // self.time_unit_ns, category=category,
            args=args, flows=flows, terminating_flows=terminating_flows,
        )

    def counter(self, track: CounterTrack, value: int | float, ts: int | None = None) -> None:
        super().counter(track, value, None if ts is None else ts // self.time_unit_ns)

"""Track handles: what a :class:`~tracer.format.TraceWriter` returns when a track is declared."""

from __future__ import annotations

__all__ = ["CounterTrack", "Track"]


class Track:
    """Handle of a declared track; pass it to the event methods.

    Tracks are declared on a :class:`TraceWriter` and belong to it: using a
    track of another writer is an :class:`UnknownTrackError`.
    """

    __slots__ = ("kind", "name", "parent", "pid", "tid", "uuid")

    def __init__(
        self,
        uuid: int,
        name: str,
        kind: str,
        parent: Track | None,
        pid: int | None = None,
        tid: int | None = None,
    ) -> None:
        self.uuid = uuid
        self.name = name
        self.kind = kind
        self.parent = parent
        self.pid = pid
        self.tid = tid

    def __repr__(self) -> str:
        return f"{type(self).__name__}(uuid={self.uuid}, name={self.name!r}, kind={self.kind!r})"


class CounterTrack(Track):
    """Handle of a counter track: only :meth:`TraceWriter.counter` takes it."""

    __slots__ = ("dedupe", "unit", "unit_multiplier")

    def __init__(
        self,
        uuid: int,
        name: str,
        parent: Track | None,
        unit: str,
        unit_multiplier: int,
        dedupe: bool,
    ) -> None:
        super().__init__(uuid, name, "counter", parent)
        self.unit = unit
        self.unit_multiplier = unit_multiplier
        self.dedupe = dedupe

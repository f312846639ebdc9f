"""Declaring tracks: the descriptors a writer emits, and the hot-path bodies made for them.

Each declaration writes its TrackDescriptor at once (before any event on
the track, as trace_processor needs) and prepares what the hot path appends
for the track later: the framed END body of a slice track, the framed
sample bodies of a counter track.
"""

from __future__ import annotations

import os

from tracer.errors import InvalidArgumentError, UnknownTrackError
from tracer.format._encoding import (
    _CHILD_ORDERING,
    _COUNTER_UNITS,
    ChildOrdering,
    CounterUnit,
    _check_id,
    _check_name,
    _check_rank,
    _Frames,
    _frames,
    _len_prefixed,
)
from tracer.format._output import _FileOutput
from tracer.format._wire import field_bytes, field_string, field_varint, packet, varint
from tracer.format.tracks import CounterTrack, Track

__all__: list[str] = []


class _TrackDeclarations(_FileOutput):
    """The track-declaring part of :class:`~tracer.format.TraceWriter`."""

    def __init__(
        self, path: str | os.PathLike[str], *, compress: bool, compression_level: int,
        buffer_size: int, sequence_id: int,
    ) -> None:
        super().__init__(
            path, compress=compress, compression_level=compression_level,
            buffer_size=buffer_size,
        )
        self._seq = b"\x50" + varint(sequence_id)
        self._next_uuid = 1
        self._tracks: dict[Track, bytes] = {}  # track -> its END body
        self._pids: dict[int, Track] = {}
        self._tids: dict[tuple[int, int], Track] = {}
        self._ordering_root_written = False
        # Hot-path bodies made at declaration (see the writer's begin/end/counter).
        self._end_frames: dict[Track, _Frames | None] = {}  # None: a counter track
        self._counter_bodies: dict[Track, tuple[_Frames, ...]] = {}

    def _new_track(self, track: Track, descriptor: bytes) -> None:
        self._buf += packet(field_bytes(60, descriptor) + self._seq)
        end_body = self._seq + b"\x5a" + _len_prefixed(b"\x48\x02\x58" + varint(track.uuid))
        self._tracks[track] = end_body
        self._end_frames[track] = None if isinstance(track, CounterTrack) else _frames(end_body)

    def _take_uuid(self) -> int:
        uuid = self._next_uuid
        self._next_uuid += 1
        return uuid

    def process_track(self, pid: int, name: str, *, rank: int | None = None) -> Track:
        """Declare a process track (one per pid), e.g. the scheduler or a node.

        ``rank`` orders processes explicitly (lowest first) in the UI.
        """
        _check_name(name)
        _check_id("pid", pid, 1 << 31)
        if pid in self._pids:
            raise InvalidArgumentError(
                f"pid {pid} already has a process track ({self._pids[pid]!r})"
            )
        track = Track(self._take_uuid(), name, "process", None, pid=pid)
        proc = field_varint(1, pid) + field_string(6, name)
        desc = field_varint(1, track.uuid) + field_bytes(3, proc)
        if rank is not None:
            desc += self._rank(rank, root_field=19)
        self._new_track(track, desc)
        self._pids[pid] = track
        return track

    def thread_track(
        self, pid: int, tid: int, name: str, *, rank: int | None = None
    ) -> Track:
        """Declare a thread track (one per (pid, tid)) inside process ``pid``.

        ``tid`` must be below 2**32, as a Linux tid is: trace_processor
        truncates a larger one to 32 bits (in a descriptor that follows the
        first event), which shows as a second, nameless thread.
        """
        _check_name(name)
        _check_id("pid", pid, 1 << 31)
        _check_id("tid", tid, 1 << 32)
        if (pid, tid) in self._tids:
            raise InvalidArgumentError(
                f"thread {pid}/{tid} already has a track ({self._tids[pid, tid]!r})"
            )
        track = Track(self._take_uuid(), name, "thread", self._pids.get(pid), pid=pid, tid=tid)
        thread = field_varint(1, pid) + field_varint(2, tid) + field_string(5, name)
        desc = field_varint(1, track.uuid) + field_bytes(4, thread)
        if rank is not None:
            desc += self._rank(rank, root_field=20)
        self._new_track(track, desc)
        self._tids[pid, tid] = track
        return track

    def track(
        self,
        name: str,
        *,
        parent: Track | None = None,
        rank: int | None = None,
        child_ordering: ChildOrdering | None = None,
        merge: bool = True,
        description: str | None = None,
    ) -> Track:
        """Declare a plain slice track, at the top level or under ``parent``.

        Siblings with the same name and parent are merged by trace_processor
        into one UI track with as many lanes as they overlap (``merge=False``
        keeps this one apart): declare a track per overlapping task, or a pool
        of lanes, all with one name. ``child_ordering="explicit"`` on a parent
        orders its children by their ``rank``.
        """
        _check_name(name)
        parent_uuid = self._check_parent(parent)
        track = Track(self._take_uuid(), name, "track", parent)
        desc = field_varint(1, track.uuid) + field_string(2, name)
        desc += self._common_fields(parent_uuid, rank, child_ordering, description)
        if not merge:
            desc += field_varint(15, 2)  # SIBLING_MERGE_BEHAVIOR_NONE
        self._new_track(track, desc)
        return track

    def counter_track(
        self,
        name: str,
        *,
        parent: Track | None = None,
        unit: CounterUnit | None = "count",
        unit_name: str | None = None,
        unit_multiplier: int = 1,
        rank: int | None = None,
        description: str | None = None,
        y_axis_share_key: str | None = None,
        dedupe: bool = True,
    ) -> CounterTrack:
        """Declare a counter track.

        ``unit`` is one of ``"count"``, ``"bytes"``, ``"ns"``; or pass
        ``unit=None, unit_name="rows/s"`` for a named unit. ``unit_multiplier``
        scales the stored integers (e.g. 1024 to store KiB and show bytes,
        which keeps memory samples short). With ``dedupe`` (the default) a
        sample equal to the previous one on the track is not written: the
        counter already holds that value.
        """
        _check_name(name)
        if unit is not None and unit not in _COUNTER_UNITS:
            raise InvalidArgumentError(
                f"unknown counter unit {unit!r}; use one of {sorted(_COUNTER_UNITS)}, "
                "or unit=None with unit_name='...' for a named unit"
            )
        if unit is None and not unit_name:
            raise InvalidArgumentError(
                "a counter track needs a unit, or unit=None with a unit_name"
            )
        if not isinstance(unit_multiplier, int) or unit_multiplier < 1:
            raise InvalidArgumentError(
                f"unit_multiplier must be a positive int, got {unit_multiplier!r}"
            )
        parent_uuid = self._check_parent(parent)
        shown_unit = unit if unit is not None else str(unit_name)
        track = CounterTrack(self._take_uuid(), name, parent, shown_unit, unit_multiplier, dedupe)
        counter = b""
        if unit is not None:
            counter += field_varint(3, _COUNTER_UNITS[unit])
        if unit_name:
            counter += field_string(6, unit_name)
        if unit_multiplier != 1:
            counter += field_varint(4, unit_multiplier)
        if y_axis_share_key:
            counter += field_string(7, y_axis_share_key)
        desc = field_varint(1, track.uuid) + field_string(2, name) + field_bytes(8, counter)
        desc += self._common_fields(parent_uuid, rank, None, description)
        self._new_track(track, desc)
        # Framed body of a sample up to its value: [0] for a double value (field
        # 44, 8 bytes), [k] for an int value whose varint takes k bytes (field 30).
        prefix = b"\x48\x04\x58" + varint(track.uuid)
        self._counter_bodies[track] = (
            _frames(self._seq + b"\x5a" + varint(len(prefix) + 10) + prefix + b"\xe1\x02", 8),
            *(
                _frames(
                    self._seq + b"\x5a" + varint(len(prefix) + 2 + k) + prefix + b"\xf0\x01", k
                )
                for k in range(1, 11)
            ),
        )
        return track

    def _check_parent(self, parent: Track | None) -> int | None:
        if parent is None:
            return None
        if parent not in self._tracks:
            raise UnknownTrackError(f"parent {parent!r} was not declared on this writer")
        if isinstance(parent, CounterTrack):
            raise InvalidArgumentError("a counter track cannot be a parent")
        return parent.uuid

    def _common_fields(
        self,
        parent_uuid: int | None,
        rank: int | None,
        child_ordering: str | None,
        description: str | None,
    ) -> bytes:
        out = b""
        if parent_uuid is not None:
            out += field_varint(5, parent_uuid)
        if description:
            out += field_string(14, description)
        if child_ordering is not None:
            if child_ordering not in _CHILD_ORDERING:
                raise InvalidArgumentError(
                    f"unknown child_ordering {child_ordering!r}; "
                    f"use one of {sorted(_CHILD_ORDERING)}"
                )
            out += field_varint(11, _CHILD_ORDERING[child_ordering])
        if rank is not None:
            _check_rank(rank)
            out += field_varint(12, rank)
        return out

    def _rank(self, rank: int, root_field: int) -> bytes:
        """Rank a process/thread; the root descriptor (uuid 0) turns explicit ordering on."""
        _check_rank(rank)
        if not self._ordering_root_written:
            root = field_varint(1, 0) + field_varint(19, 1) + field_varint(20, 1)
            self._buf += packet(field_bytes(60, root) + self._seq)
            self._ordering_root_written = True
        return field_varint(12, rank)

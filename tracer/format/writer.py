"""Streaming writer of native Perfetto protobuf traces.

Why it looks the way it does:

* **Streamed, bounded, crash-safe.** Packets go into a byte buffer that is
  written to the file with one ``write`` whenever it passes ``buffer_size``
  (and on :meth:`TraceWriter.flush`). A file cut at any point is a valid trace
  up to its last complete packet; with compression, up to its last complete
  bundle. Memory stays bounded however long the trace: the buffer is flushed,
  and the interning tables and per-event byte caches stop growing at a cap.
* **Cheap per event.** The hot path (:meth:`begin`, :meth:`end`,
  :meth:`instant`, :meth:`counter`) appends bytes built protozero-style from
  cached per-(track, name) bodies framed ahead: two dict lookups and two or
  three ``+=`` of prebuilt bytes (the timestamp delta's varint comes from
  tables). It does not validate; events whose track, name or category are seen
  for the first time take a slow path that does. When the optional C
  extension was built (:mod:`tracer.format._speedups`), the same hot path
  runs in C, writing the same bytes and handing the Python methods below
  every call it does not take: they remain the definition of what is written.
* **Compact.** Names, categories, annotation names and repeated string values
  are interned per sequence; timestamps are delta-encoded through an
  incremental clock (id 64) anchored by a ClockSnapshot that also records
  REALTIME, so the UI shows time of day. Events that arrive late (a worker
  reports a start after later events were written) are written with an
  absolute BOOTTIME timestamp, which lands at the true time and leaves the
  delta chain alone.

Timestamps are nanoseconds in the domain of ``clock`` (``time.time_ns`` by
default, the one clock that all the nodes of a cluster share), recorded at a
resolution of ``time_unit_ns`` (1 ns by default).

The writer is not thread-safe: serialise calls from several threads yourself
(the Ray layer does).
"""

from __future__ import annotations

import collections
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from tracer.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    TraceWriteError,
    TraceWriterClosedError,
    UnknownTrackError,
    ValueOutOfRangeError,
)
from tracer.format._wire import (
    CHILD_ORDERING,
    CLOCK_BOOTTIME,
    CLOCK_INCREMENTAL,
    CLOCK_REALTIME,
    COUNTER_UNITS,
    INT64_MAX,
    INT64_MIN,
    TYPE_BEGIN,
    TYPE_COUNTER,
    TYPE_END,
    TYPE_INSTANT,
    UINT64_MAX,
    VARINT_CONT14,
    VARINT_TABLE,
    field_bytes,
    field_double,
    field_fixed64,
    field_string,
    field_varint,
    packet,
    varint,
)

try:  # the hot path in C, built at install when a compiler is there (see _speedups.c)
    from tracer.format import _speedups
except ImportError:  # pragma: no cover - a build without it: the same writer, in Python
    _speedups = None  # type: ignore[assignment]

__all__ = [
    "CounterSequence",
    "CounterTrack",
    "CounterUnit",
    "ChildOrdering",
    "Track",
    "TraceWriter",
]

CounterUnit = Literal["count", "bytes", "ns"]
ChildOrdering = Literal["lexicographic", "chronological", "explicit"]

_COUNTER_UNITS = COUNTER_UNITS
_CHILD_ORDERING = CHILD_ORDERING

# TrackEvent.Type values.
_BEGIN = TYPE_BEGIN
_END = TYPE_END
_INSTANT = TYPE_INSTANT
_COUNTER = TYPE_COUNTER

_CLOCK_BOOTTIME = CLOCK_BOOTTIME
_CLOCK_REALTIME = CLOCK_REALTIME
_CLOCK_INCREMENTAL = CLOCK_INCREMENTAL
_ABSOLUTE_CLOCK = b"\xd0\x03\x06"  # TracePacket.timestamp_clock_id = BOOTTIME

_INT64_MIN = INT64_MIN
_INT64_MAX = INT64_MAX
_UINT64_MAX = UINT64_MAX

#: Interning stops adding entries past this many per table (bounded memory);
#: further new strings are written inline.
DEFAULT_INTERN_LIMIT = 65536
#: The per-(track, name) body caches stop growing past this many entries.
_BODY_CACHE_LIMIT = 200_000
#: String annotation values longer than this are never interned.
_MAX_INTERNED_VALUE_LEN = 256
#: The coarsest ``time_unit_ns``: one second.
_MAX_TIME_UNIT_NS = 1_000_000_000
#: Strings seen once are remembered in a set that is emptied at this size.
_SEEN_ONCE_LIMIT = 8192
#: Encoded (name, value) annotations kept for reuse; emptied when full.
_ARG_CACHE_LIMIT = 4096
_SCALARS = (str, int, float, bool)
#: Nested dicts and lists in annotations deeper than this are refused.
MAX_ARG_DEPTH = 32

# Hot-path tables and framing. A cached event is written as one packet:
# ``0A <length> <body> 40 <timestamp delta varint>`` (Trace.packet, then the
# TracePacket's fields with TracePacket.timestamp last), built from pieces
# framed ahead so that an event appends two or three slices and allocates
# nothing but the delta:
#
# * delta < 2**7 (1 varint byte):   frame1, VARINT_TABLE[delta]
# * delta < 2**14 (2 bytes):        frame2, VARINT_TABLE[delta]
# * delta < 2**21 (3 bytes, 2 ms):  frame3, VARINT_CONT14[delta & 0x3FFF], VARINT_TABLE[delta >> 14]
#
# where frameK is the packet head for a K-byte delta, the body and the
# timestamp tag. The timestamp goes last because it is the part of a packet
# that is never the same twice: after it, the next packet's head and body
# repeat earlier bytes, which zlib then matches in one run instead of two
# (``compress=True`` files are ~10% smaller; protobuf readers take fields in
# any order).
_VT = VARINT_TABLE
_DOUBLE = struct.Struct("<d")
_VARINT_CONT2 = VARINT_CONT14  # the low 14 bits of a longer varint
_TS_TAG = b"\x40"  # TracePacket.timestamp


#: ``(frame1, frame2, frame3, body)``, see above.
_Frames = tuple[bytes, bytes, bytes, bytes]


def _frames(body: bytes, extra: int = 0) -> _Frames:
    """The pieces of a packet ``body`` (+ ``extra`` bytes) + timestamp field.

    With ``extra`` (a counter's value, appended by the caller) the frames end
    at the body and the caller appends the value, then the timestamp tag.
    """
    n = len(body) + extra + 1  # the body, what follows and the timestamp tag
    tail = b"" if extra else _TS_TAG
    return (
        b"\x0a" + varint(n + 1) + body + tail,
        b"\x0a" + varint(n + 2) + body + tail,
        b"\x0a" + varint(n + 3) + body + tail,
        body,
    )


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


class _ClosedBuffer:
    """Stands in for the buffer after close, so the hot path needs no closed check."""

    def __iadd__(self, other: object) -> _ClosedBuffer:
        raise TraceWriterClosedError("the trace writer is closed; no more events can be written")

    __add__ = __iadd__

    def __len__(self) -> int:
        return 0


_MISSING = object()


class _NoLastValues(dict):  # type: ignore[type-arg]
    """Stands in for the counter dedupe memo after close: nothing equals a last
    value, so counter() always reaches the closed buffer (and raises)."""

    def get(self, key: object, default: object = None) -> object:
        return _MISSING

    def __setitem__(self, key: object, value: object) -> None:
        pass


class TraceWriter:
    """Writes one Perfetto trace file, streaming.

    >>> with TraceWriter("run.perfetto-trace") as w:  # doctest: +SKIP
    ...     loop = w.thread_track(pid=1, tid=1, name="dispatch loop")
    ...     w.begin(loop, "wave")
    ...     w.end(loop)

    ``compress=True`` bundles packets into zlib ``compressed_packets`` of
    about ``buffer_size`` (2.5-5x smaller files). :meth:`flush` still puts
    events on disk at once: they are appended raw and later rewritten as part
    of a bundle, so a file cut at any point reads up to its last complete
    packet either way. ``buffer_size`` bounds the memory held between flushes.

    ``time_unit_ns`` sets the resolution timestamps are recorded at (they are
    still given in ns, and read back in ns): 1000 records microseconds, as
    Chrome JSON traces do, and as Perfetto's own SDK can
    (``timestamp_unit_multiplier``). The deltas between events then take
    fewer bytes: ~8% smaller files, ~25% smaller with ``compress=True``.
    Each timestamp is rounded down to a multiple of the unit, so two events
    less than a unit apart may share one, and a slice shorter than a unit may
    have no duration.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        compress: bool = False,
        compression_level: int = 6,
        buffer_size: int = 256 * 1024,
        clock: Callable[[], int] = time.time_ns,
        sequence_id: int = 1,
        intern_limit: int = DEFAULT_INTERN_LIMIT,
        time_unit_ns: int = 1,
    ) -> None:
        if time_unit_ns.__class__ is not int or not 1 <= time_unit_ns <= _MAX_TIME_UNIT_NS:
            raise InvalidArgumentError(
                f"time_unit_ns must be an int in 1..{_MAX_TIME_UNIT_NS}, got {time_unit_ns!r}"
            )
        if time_unit_ns != 1 and not isinstance(self, _CoarseTraceWriter):
            # Timestamps in coarser units are converted where they enter, in a
            # subclass, so the default (ns) hot path pays nothing for the option.
            self.__class__ = _coarse_class(type(self))
        for option, value in (("buffer_size", buffer_size),
                              ("compression_level", compression_level),
                              ("sequence_id", sequence_id)):
            if value.__class__ is bool or not isinstance(value, int):
                raise InvalidArgumentTypeError(
                    f"{option} must be an int, got {type(value).__name__} {value!r}"
                )
        if buffer_size < 1024:
            raise InvalidArgumentError(
                f"buffer_size must be at least 1024 bytes, got {buffer_size}"
            )
        if not 0 <= compression_level <= 9:
            raise InvalidArgumentError(f"compression_level must be 0-9, got {compression_level}")
        if not 0 < sequence_id < (1 << 32):
            raise InvalidArgumentError(f"sequence_id must be in 1..2**32-1, got {sequence_id}")
        self.path = Path(path)
        self._file = _open_for_writing(self.path)
        self._compress = compress
        self._compression_level = compression_level
        self._limit = buffer_size
        #: The resolution timestamps are recorded at; the hot path works in these units.
        self.time_unit_ns = time_unit_ns
        self._clock = clock if time_unit_ns == 1 else lambda: clock() // time_unit_ns
        self._intern_limit = intern_limit
        self._seq = b"\x50" + varint(sequence_id)

        self._buf: bytearray | _ClosedBuffer = bytearray()
        self._tail = bytearray()  # raw packets on disk that the next bundle will replace
        # Chunks taken from the buffer, written in order under _io_lock (see detach()).
        self._outbox: collections.deque[tuple[bytes, bool]] = collections.deque()
        self._io_lock = threading.Lock()
        self._file_end = 0
        self.bytes_written = 0
        self._next_uuid = 1
        self._next_flow = 1
        self._tracks: dict[Track, bytes] = {}  # track -> its END body
        self._pids: dict[int, Track] = {}
        self._tids: dict[tuple[int, int], Track] = {}
        self._ordering_root_written = False
        # Hot-path caches (see begin/end/instant/counter): keyed by track first,
        # then by name (or (name, category)), so a lookup allocates nothing.
        self._end_frames: dict[Track, _Frames | None] = {}  # None: a counter track
        self._counter_bodies: dict[Track, tuple[_Frames, ...]] = {}
        self._counter_last: dict[Track, object] = {}
        self._begin_cache: dict[Track, dict[str | tuple[str, str], _Frames]] = {}
        self._instant_cache: dict[Track, dict[str | tuple[str, str], _Frames]] = {}
        self._cache_sizes = {_BEGIN: 0, _INSTANT: 0}
        self._names: dict[str, int] = {}
        self._categories: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._string_values: dict[str, int] = {}
        self._seen_once: set[str] = set()
        self._seen_twice: set[str] = set()
        # Encoded annotations by (name, value) for repeated scalar values.
        self._arg_cache: dict[tuple[Any, ...], bytes] = {}
        # Encoded TrackEvent heads (type, track, name, category) of events
        # with args written before, by (kind, track, name, category): see _fast_event.
        self._heads: dict[tuple[Any, ...], bytes] = {}

        start = clock()
        #: Where the trace's clock starts, in ns (rounded down to ``time_unit_ns``).
        self.start_ts = start - start % time_unit_ns
        self._last = start // time_unit_ns  # the delta chain, in units
        self._write_setup_packet(time.time_ns() if clock is not time.time_ns else start)
        if time_unit_ns == 1 and type(self).now is TraceWriter.now:
            self.__dict__["now"] = clock  # the same reading, one call fewer (a hot call)
        self._encoder: Any = None
        if _speedups is not None and use_speedups():
            self._accelerate(realtime_clock=clock is time.time_ns)

    def _accelerate(self, realtime_clock: bool) -> None:
        """Route begin/end/instant/counter through the C encoder (tracer.format._speedups).

        It writes the bytes these Python methods would, into the same buffer,
        with the same caches, and hands them every call it does not take.
        A subclass that overrides one of the methods keeps its own.
        """
        base = _CoarseTraceWriter if self.time_unit_ns != 1 else TraceWriter
        encoder = _speedups.Encoder(self, realtime_clock=realtime_clock)
        for name in ("begin", "end", "instant", "counter"):
            if getattr(type(self), name) is getattr(base, name):
                self.__dict__[name] = getattr(encoder, name)
        self._encoder = encoder

    # ----------------------------------------------------------------- setup

    def _write_setup_packet(self, realtime_ns: int) -> None:
        t0 = self.start_ts
        clock64 = field_varint(1, _CLOCK_INCREMENTAL) + field_varint(2, self._last)
        clock64 += field_varint(3, 1)  # is_incremental
        if self.time_unit_ns != 1:
            clock64 += field_varint(4, self.time_unit_ns)  # unit_multiplier_ns
        clocks = (
            field_bytes(1, field_varint(1, _CLOCK_BOOTTIME) + field_varint(2, t0))
            + field_bytes(1, field_varint(1, _CLOCK_REALTIME) + field_varint(2, realtime_ns))
            + field_bytes(1, clock64)
        )
        defaults = field_varint(58, _CLOCK_INCREMENTAL)
        payload = (
            field_bytes(6, clocks)  # clock_snapshot
            + self._seq
            + field_varint(13, 1)  # sequence_flags = SEQ_INCREMENTAL_STATE_CLEARED
            + field_bytes(59, defaults)  # trace_packet_defaults
        )
        self._buf += packet(payload)

    # ---------------------------------------------------------------- tracks

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

    # ---------------------------------------------------------------- events

    def new_flow_id(self) -> int:
        """A fresh flow id, unique in this trace (put it on both ends of an arrow)."""
        flow = self._next_flow
        self._next_flow += 1
        return flow

    def now(self) -> int:
        """The writer's clock, in ns."""
        return self._clock()

    # Extra packet sequences opened by counter_sequence() so far.
    _counter_sequences = 0

    def counter_sequence(
        self, tracks: Iterable[CounterTrack], *, time_unit_ns: int = 1000
    ) -> CounterSequence:
        """A packet sequence of its own for samples of ``tracks`` (1 to 9 counter tracks).

        For counters whose samples arrive late (measured elsewhere, written
        after later events): on the writer's own sequence they would need
        absolute timestamps (~9 bytes each). Here they get their own
        incremental clock, in units of ``time_unit_ns``, and packet defaults
        naming the tracks, so a sample of all of them is ~``48 04 F0 01 <v1>
        60 <v2>`` plus a 1-3 byte delta. See :class:`CounterSequence`.
        """
        tracks = tuple(tracks)
        if not 1 <= len(tracks) <= 1 + _MAX_EXTRA_COUNTERS:
            raise InvalidArgumentError(
                f"a counter sequence takes 1 to {1 + _MAX_EXTRA_COUNTERS} tracks, got {len(tracks)}"
            )
        for track in tracks:
            if not isinstance(track, CounterTrack) or track not in self._tracks:
                raise UnknownTrackError(f"{track!r} is not a counter track declared on this writer")
        if len({t.uuid for t in tracks}) != len(tracks):
            raise InvalidArgumentError("a counter sequence cannot name a track twice")
        if not isinstance(time_unit_ns, int) or time_unit_ns < 1:
            raise InvalidArgumentError(f"time_unit_ns must be a positive int, got {time_unit_ns!r}")
        self._counter_sequences += 1
        sequence_id = _varint_value(self._seq, 1) + self._counter_sequences
        if sequence_id >= 1 << 32:
            raise InvalidArgumentError("no packet sequence id left for another counter sequence")
        return CounterSequence(self, sequence_id, tracks, time_unit_ns)

    # The hot path. A cached event is one packet ``frame + delta varint``
    # framed ahead (see _frames): per event, two dict lookups (track, then name)
    # and two or three ``+=`` of prebuilt bytes on the buffer; for a delta under
    # 2 ms nothing is encoded. Anything else (a longer gap, a late event, a
    # first occurrence, args or flows) goes through _emit or _event.

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
        """Open a slice on ``track``; slices on one track must nest (end closes the latest)."""
        if args or flows or terminating_flows:
            self._event(_BEGIN, track, name, ts, category, args, flows, terminating_flows)
            return
        try:
            frames = self._begin_cache[track][name if category is None else (name, category)]
        except KeyError:
            self._event(_BEGIN, track, name, ts, category, None, None, None)
            return
        if ts is None:
            ts = self._clock()
        buf = self._buf
        try:  # each delta is encoded before anything is buffered: a bad ts writes nothing
            delta = ts - self._last
            if 16383 < delta < 2097152:
                low = _VARINT_CONT2[delta & 16383]
                buf += frames[2]
                buf += low
                buf += _VT[delta >> 14]
                self._last = ts
            elif 127 < delta < 16384:
                encoded_delta = _VT[delta]
                buf += frames[1]
                buf += encoded_delta
                self._last = ts
            elif 0 <= delta < 128:
                encoded_delta = _VT[delta]
                buf += frames[0]
                buf += encoded_delta
                self._last = ts
            else:
                self._emit(ts, frames[3])
        except TypeError:
            raise _timestamp_type_error(ts) from None
        if len(buf) >= self._limit:
            self._flush_buffer()

    def end(
        self,
        track: Track,
        ts: int | None = None,
        *,
        args: Mapping[str, Any] | None = None,
        flows: Iterable[int] | None = None,
    ) -> None:
        """Close the most recent open slice on ``track``; ``args`` are merged into it."""
        if args or flows:
            self._event(_END, track, None, ts, None, args, flows, None)
            return
        try:
            frames = self._end_frames[track]
        except KeyError:
            raise UnknownTrackError(f"{track!r} was not declared on this writer") from None
        if frames is None:
            raise InvalidArgumentError(f"{track!r} is a counter track: it has no slices to end")
        if ts is None:
            ts = self._clock()
        buf = self._buf
        try:  # each delta is encoded before anything is buffered: a bad ts writes nothing
            delta = ts - self._last
            if 16383 < delta < 2097152:
                low = _VARINT_CONT2[delta & 16383]
                buf += frames[2]
                buf += low
                buf += _VT[delta >> 14]
                self._last = ts
            elif 127 < delta < 16384:
                encoded_delta = _VT[delta]
                buf += frames[1]
                buf += encoded_delta
                self._last = ts
            elif 0 <= delta < 128:
                encoded_delta = _VT[delta]
                buf += frames[0]
                buf += encoded_delta
                self._last = ts
            else:
                self._emit(ts, frames[3])
        except TypeError:
            raise _timestamp_type_error(ts) from None
        if len(buf) >= self._limit:
            self._flush_buffer()

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
        """A zero-duration event on ``track``."""
        if args or flows or terminating_flows:
            self._event(_INSTANT, track, name, ts, category, args, flows, terminating_flows)
            return
        try:
            frames = self._instant_cache[track][name if category is None else (name, category)]
        except KeyError:
            self._event(_INSTANT, track, name, ts, category, None, None, None)
            return
        if ts is None:
            ts = self._clock()
        buf = self._buf
        try:  # each delta is encoded before anything is buffered: a bad ts writes nothing
            delta = ts - self._last
            if 16383 < delta < 2097152:
                low = _VARINT_CONT2[delta & 16383]
                buf += frames[2]
                buf += low
                buf += _VT[delta >> 14]
                self._last = ts
            elif 127 < delta < 16384:
                encoded_delta = _VT[delta]
                buf += frames[1]
                buf += encoded_delta
                self._last = ts
            elif 0 <= delta < 128:
                encoded_delta = _VT[delta]
                buf += frames[0]
                buf += encoded_delta
                self._last = ts
            else:
                self._emit(ts, frames[3])
        except TypeError:
            raise _timestamp_type_error(ts) from None
        if len(buf) >= self._limit:
            self._flush_buffer()

    def complete(
        self,
        track: Track,
        name: str,
        start_ts: int,
        end_ts: int,
        *,
        category: str | None = None,
        args: Mapping[str, Any] | None = None,
        flows: Iterable[int] | None = None,
        terminating_flows: Iterable[int] | None = None,
    ) -> None:
        """A whole slice at once (BEGIN and END), e.g. one measured elsewhere and reported late."""
        if end_ts < start_ts:
            raise InvalidArgumentError(
                f"slice {name!r} ends ({end_ts}) before it starts ({start_ts})"
            )
        self.begin(
            track, name, start_ts, category=category, args=args, flows=flows,
            terminating_flows=terminating_flows,
        )
        self.end(track, end_ts)

    def counter(self, track: CounterTrack, value: int | float, ts: int | None = None) -> None:
        """One sample on a counter track (an int, or a float for a double counter)."""
        try:
            bodies = self._counter_bodies[track]
        except KeyError:
            raise UnknownTrackError(
                f"{track!r} is not a counter track declared on this writer"
            ) from None
        if value.__class__ is int:
            if 0 <= value < 16384:
                encoded = _VT[value]
            elif 16384 <= value < 268435456:
                encoded = _VARINT_CONT2[value & 16383] + _VT[value >> 14]
            elif _INT64_MIN <= value <= _INT64_MAX:
                encoded = varint(value)
            else:
                raise ValueOutOfRangeError(f"counter value {value} does not fit in int64")
            frames = bodies[len(encoded)]
        elif isinstance(value, float):
            encoded = _DOUBLE.pack(value)
            frames = bodies[0]
        elif isinstance(value, int) and not isinstance(value, bool):  # an int subclass
            value = int(value)
            if not _INT64_MIN <= value <= _INT64_MAX:
                raise ValueOutOfRangeError(f"counter value {value} does not fit in int64")
            encoded = varint(value)
            frames = bodies[len(encoded)]
        else:
            raise InvalidArgumentTypeError(
                f"a counter value must be an int or a float, got {type(value).__name__}"
            )
        dedupe = track.dedupe
        if dedupe and self._counter_last.get(track, _MISSING) == value:
            return
        if ts is None:
            ts = self._clock()
        buf = self._buf
        try:  # each delta is encoded before anything is buffered: a bad ts writes nothing
            delta = ts - self._last
            if 16383 < delta < 2097152:
                low = _VARINT_CONT2[delta & 16383]
                buf += frames[2]
                buf += encoded
                buf += _TS_TAG
                buf += low
                buf += _VT[delta >> 14]
                self._last = ts
            elif 127 < delta < 16384:
                encoded_delta = _VT[delta]
                buf += frames[1]
                buf += encoded
                buf += _TS_TAG
                buf += encoded_delta
                self._last = ts
            elif 0 <= delta < 128:
                encoded_delta = _VT[delta]
                buf += frames[0]
                buf += encoded
                buf += _TS_TAG
                buf += encoded_delta
                self._last = ts
            else:
                self._emit(ts, frames[3] + encoded)
        except TypeError:
            raise _timestamp_type_error(ts) from None
        if dedupe:  # once written: a rejected call must not hide the next same value
            self._counter_last[track] = value
        if len(buf) >= self._limit:
            self._flush_buffer()

    def _emit(self, ts: int, body: bytes) -> None:
        """Frame and buffer one timestamped packet (delta, or absolute when late)."""
        try:  # encoded before any state changes: a bad ts leaves the writer as it was
            delta = ts - self._last
            if 0 <= delta < 16384:
                inner = body + _TS_TAG + _VT[delta]
                self._last = ts
            elif delta >= 0:
                inner = body + _TS_TAG + varint(delta)
                self._last = ts
            else:
                if ts < 0:
                    raise InvalidArgumentError(f"timestamp {ts} is negative")
                inner = body + _ABSOLUTE_CLOCK + _TS_TAG + varint(ts * self.time_unit_ns)
        except TypeError:
            raise _timestamp_type_error(ts) from None
        n = len(inner)
        self._buf += b"\x0a" + (_VT[n] if n < 16384 else varint(n)) + inner

    def _event(
        self,
        kind: int,
        track: Track,
        name: str | None,
        ts: int | None,
        category: str | None,
        args: Mapping[str, Any] | None,
        flows: Iterable[int] | None,
        terminating_flows: Iterable[int] | None,
    ) -> None:
        """Events off the cached-body path: args, flows, or a first occurrence.

        An event with args whose head was written before goes through
        :meth:`_fast_event`; the rest (and what it hands back) is the slow
        path: it validates, interns, encodes args and flows, fills the caches.
        """
        if args.__class__ is dict:
            head = self._heads.get((kind, track, name, category))
            if head is not None and self._fast_event(head, ts, args, flows, terminating_flows):
                return
        if track not in self._tracks:
            raise UnknownTrackError(f"{track!r} was not declared on this writer")
        if isinstance(track, CounterTrack):
            raise InvalidArgumentError(f"{track!r} is a counter track; use counter()")
        interned: list[bytes] = []
        tables = (self._names, self._categories, self._arg_names, self._string_values)
        sizes = [len(table) for table in tables]
        try:
            # Type, name and category, then the track: bytes that repeat across
            # tracks come first, for zlib (~1% smaller bundles than track first).
            event = b"\x48" + VARINT_TABLE[kind]
            if name is not None:
                _check_name(name)
                iid = self._intern(self._names, name, 2, interned)
                event += b"\x50" + varint(iid) if iid else field_string(23, name)
            if category is not None:
                if not isinstance(category, str):
                    raise InvalidArgumentTypeError(
                        f"category must be a str, got {type(category).__name__}"
                    )
                iid = self._intern(self._categories, category, 1, interned)
                event += b"\x18" + varint(iid) if iid else field_string(22, category)
            event += b"\x58" + varint(track.uuid)
            head = event
            cacheable = not (args or flows or terminating_flows) and kind != _END
            if flows or terminating_flows:
                event += _flow_fields(flows, terminating_flows)
            if args:
                if not isinstance(args, Mapping):
                    raise InvalidArgumentTypeError(
                        f"args must be a mapping, got {type(args).__name__}"
                    )
                arg_cache = self._arg_cache
                for key, value in args.items():
                    ckey = _arg_cache_key(key, value)
                    encoded = arg_cache.get(ckey) if ckey is not None else None
                    if encoded is None:
                        before = len(interned)
                        encoded = field_bytes(4, self._annotation(key, value, interned, 0))
                        # Reusable only if it defined nothing new (interned
                        # definitions go out once) and is not a string that
                        # may be interned on its next use.
                        if ckey is not None and len(interned) == before and (
                            value.__class__ is not str or value in self._string_values
                        ):
                            if len(arg_cache) >= _ARG_CACHE_LIMIT:
                                arg_cache.clear()
                            arg_cache[ckey] = encoded
                    event += encoded
            body = self._seq + b"\x5a" + varint(len(event)) + event
            packet_body = body + field_bytes(12, b"".join(interned)) if interned else body
            if ts is None:
                ts = self._clock()
            self._emit(ts, packet_body)
        except BaseException:
            # Nothing was written: forget what was interned for this event, or
            # later events would use iids that are never defined in the trace.
            for table, size in zip(tables, sizes, strict=True):
                while len(table) > size:
                    table.popitem()
            raise
        if args:
            heads = self._heads
            if len(heads) >= _ARG_CACHE_LIMIT:
                heads.clear()
            heads[(kind, track, name, category)] = head
        if cacheable and name is not None and self._cache_sizes[kind] < _BODY_CACHE_LIMIT:
            cache = self._begin_cache if kind == _BEGIN else self._instant_cache
            per_track = cache.get(track)
            if per_track is None:
                per_track = cache[track] = {}
            cache_key = name if category is None else (name, category)
            if cache_key not in per_track:
                per_track[cache_key] = _frames(body)
                self._cache_sizes[kind] += 1
        if len(self._buf) >= self._limit:
            self._flush_buffer()

    def _fast_event(
        self,
        head: bytes,
        ts: int | None,
        args: dict[str, Any],
        flows: Iterable[int] | None,
        terminating_flows: Iterable[int] | None,
    ) -> bool:
        """An event with args whose head (kind, track, name, category) was written before.

        The track, name and category were validated and interned then, so
        only the args are encoded: scalar values of already-interned names
        inline (string values interned as usual), flat dicts from the
        annotation cache. Anything else (a new arg name, a nested or unusual
        value) returns False with nothing written and what it interned
        forgotten, and the slow path takes the event. The runner's per-task
        events cost about a third of the slow path this way.
        """
        if ts is not None and (ts.__class__ is not int or ts < 0):
            return False  # the slow path says what is wrong with it
        event = head
        if flows or terminating_flows:
            event += _flow_fields(flows, terminating_flows)
        names = self._arg_names
        interned: list[bytes] = []
        for key, value in args.items():
            iid = names.get(key)
            if iid is None or iid >= 16384:
                return self._unintern(interned)
            cls = value.__class__
            if cls is int:
                if 0 <= value < 16384:
                    ann = b"\x08" + _VT[iid] + b"\x20" + _VT[value]
                elif _INT64_MIN <= value <= _INT64_MAX:
                    ann = b"\x08" + _VT[iid] + b"\x20" + varint(value)
                else:
                    return self._unintern(interned)
            elif cls is str:
                ann = b"\x08" + _VT[iid] + self._string_value(value, interned)
            elif cls is float:
                ann = b"\x08" + _VT[iid] + b"\x29" + _DOUBLE.pack(value)
            elif cls is bool:
                ann = b"\x08" + _VT[iid] + (b"\x10\x01" if value else b"\x10\x00")
            elif cls is dict:
                ckey = _arg_cache_key(key, value)
                cached = self._arg_cache.get(ckey) if ckey is not None else None
                if cached is None:
                    return self._unintern(interned)
                event += cached
                continue
            else:
                return self._unintern(interned)
            n = len(ann)
            event += b"\x22" + (_VT[n] if n < 16384 else varint(n)) + ann
        n = len(event)
        body = self._seq + b"\x5a" + (_VT[n] if n < 16384 else varint(n)) + event
        if interned:
            body += field_bytes(12, b"".join(interned))
        self._emit(self._clock() if ts is None else ts, body)
        if len(self._buf) >= self._limit:
            self._flush_buffer()
        return True

    def _unintern(self, interned: list[bytes]) -> bool:
        """Give up a fast event: forget the string values it interned (never written)."""
        values = self._string_values
        for _ in interned:
            values.popitem()  # the newest entries: the ones this event added
        return False

    def _intern(self, table: dict[str, int], text: str, field: int, out: list[bytes]) -> int:
        """The iid of ``text`` (defining it in ``out`` when new), or 0 past the cap."""
        iid = table.get(text)
        if iid is None:
            if len(table) >= self._intern_limit:
                return 0
            iid = len(table) + 1
            table[text] = iid
            out.append(field_bytes(field, field_varint(1, iid) + field_string(2, text)))
        return iid

    def _annotation(self, key: object, value: object, interned: list[bytes], depth: int) -> bytes:
        """Encode one DebugAnnotation (without its outer tag)."""
        if depth > MAX_ARG_DEPTH:
            raise InvalidArgumentError(f"annotation nested deeper than {MAX_ARG_DEPTH} levels")
        if key is None:
            out = b""
        elif not isinstance(key, str):
            raise InvalidArgumentTypeError(
                f"annotation names must be str, got {type(key).__name__}"
            )
        else:
            # Dict keys are interned like top-level names (trace_processor
            # resolves name_iid at every level of a nested annotation).
            iid = self._intern(self._arg_names, key, 3, interned)
            out = b"\x08" + varint(iid) if iid else field_string(10, key)
        if value is True or value is False:
            return out + b"\x10" + (b"\x01" if value else b"\x00")
        if isinstance(value, int):
            if _INT64_MIN <= value <= _INT64_MAX:
                return out + field_varint(4, value)
            if 0 <= value <= _UINT64_MAX:
                return out + field_varint(3, value)
            return out + field_string(6, str(value))
        if isinstance(value, float):
            return out + field_double(5, value)
        if isinstance(value, str):
            return out + self._string_value(value, interned)
        if isinstance(value, Mapping):
            for k, v in value.items():
                out += field_bytes(11, self._annotation(k, v, interned, depth + 1))
            return out
        if isinstance(value, (list, tuple)):
            for v in value:
                out += field_bytes(12, self._annotation(None, v, interned, depth + 1))
            return out
        return out + self._string_value(str(value), interned)

    def _string_value(self, value: str, interned: list[bytes]) -> bytes:
        """A string value, interned from its third occurrence on (repeats only).

        Why the third: an interned value costs its definition (the string and
        ~7 bytes) plus ~3 bytes per use, an inline one its length plus 2. A
        value used twice, like a task id on its task and on its execution, is
        smaller inline; from the third use on, interning wins.
        """
        iid = self._string_values.get(value)
        if iid is not None:
            return b"\x88\x01" + varint(iid)
        if len(value) <= _MAX_INTERNED_VALUE_LEN and len(self._string_values) < self._intern_limit:
            if value in self._seen_twice:
                iid = len(self._string_values) + 1
                self._string_values[value] = iid
                interned.append(
                    field_bytes(29, field_varint(1, iid) + field_string(2, value))
                )
                return b"\x88\x01" + varint(iid)
            seen = self._seen_twice if value in self._seen_once else self._seen_once
            if len(seen) >= _SEEN_ONCE_LIMIT:
                seen.clear()
            seen.add(value)
        return field_string(6, value)

    # ----------------------------------------------------------- lifecycle

    def _flush_buffer(self, durable_only: bool = False) -> None:
        """Write the buffer out.

        Uncompressed, the packets are appended as they are. Compressed, small
        flushes (``durable_only``: the caller wants the events on disk now, as
        a runner does at every wave) append the packets raw, as a *tail*; once
        the tail and buffer reach ``buffer_size`` (and at close) they become
        one zlib bundle written over the tail. Small per-flush bundles would
        compress about 3x worse than big ones, and this keeps both: every
        flush is durable, and the file ends up made of big bundles.
        """
        self._take(durable_only)
        self._drain_outbox()

    def _take(self, durable_only: bool) -> None:
        """Move the buffer to the outbox (no I/O), in event order."""
        buf = self._buf
        if len(buf):
            self._outbox.append((bytes(buf), durable_only))  # type: ignore[arg-type]
            buf.clear()  # type: ignore[union-attr]
        elif not durable_only:
            self._outbox.append((b"", False))  # at close: bundle the raw tail

    def _drain_outbox(self) -> None:
        """Write what was taken, in the order it was taken (one writer of the file at a time)."""
        with self._io_lock:
            outbox = self._outbox
            while outbox:
                data, durable_only = outbox.popleft()
                self._commit(data, durable_only)

    def _commit(self, data: bytes, durable_only: bool) -> None:
        if not data and (durable_only or not self._tail):
            return
        if not self._compress:
            self._write(data)
            return
        if durable_only and len(self._tail) + len(data) < self._limit:
            self._write(data)
            self._tail += data
            return
        raw = bytes(self._tail) + data if self._tail else data
        self._write_bundle(packet(field_bytes(50, zlib.compress(raw, self._compression_level))))

    def _write_bundle(self, bundle: bytes) -> None:
        """Append ``bundle``, replacing the raw tail it contains.

        The file must be a valid trace at every instant, even if this process
        is killed between two system calls. So the bundle goes over the tail
        in one ``pwrite`` (a kill cannot split a system call), padded with an
        ignorable packet to the tail's length, and only then is the padding
        cut off with ``ftruncate``.
        """
        tail_len = len(self._tail)
        if not tail_len:
            self._write(bundle)
            return
        start = self._file_end - tail_len
        gap = tail_len - len(bundle)
        try:
            fd = self._file.fileno()
            os.pwrite(fd, bundle + _padding(gap), start)
            end = start + len(bundle)
            os.ftruncate(fd, end)
            self._file.seek(end)
        except OSError as exc:
            raise TraceWriteError(f"cannot write trace file {self.path}: {exc}") from exc
        self._tail.clear()
        self._file_end = end
        self.bytes_written = end

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                written = self._file.write(view)
                if not written:
                    raise OSError("short write")
                view = view[written:]
        except OSError as exc:
            raise TraceWriteError(f"cannot write trace file {self.path}: {exc}") from exc
        self.bytes_written += len(data)
        self._file_end += len(data)

    def flush(self) -> None:
        """Write everything buffered to the file now (raw when compressing; see _flush_buffer)."""
        if isinstance(self._buf, _ClosedBuffer):
            return
        self._flush_buffer(durable_only=True)

    def detach(self) -> None:
        """Take what is buffered for :meth:`write_detached`, without any I/O.

        For a writer shared by threads: call ``detach`` where events are
        written (under the caller's own lock), and ``write_detached`` from
        another thread, outside that lock, so event writers never wait for
        the disk. Chunks are written in the order they were detached.
        """
        if not isinstance(self._buf, _ClosedBuffer):
            self._take(durable_only=True)

    def write_detached(self) -> None:
        """Write everything :meth:`detach` took (thread-safe; raises TraceWriteError)."""
        self._drain_outbox()

    def file_removed(self) -> bool:
        """Whether the trace file was deleted (or its folder) while open.

        On Linux writes to a deleted file succeed and vanish, so a long-running
        writer checks this now and then (one ``fstat``, about a microsecond).
        """
        if self.closed:
            return False
        try:
            return os.fstat(self._file.fileno()).st_nlink == 0
        except OSError:
            return True

    @property
    def closed(self) -> bool:
        return isinstance(self._buf, _ClosedBuffer)

    def close(self) -> None:
        """Flush and close the file; further events raise :class:`TraceWriterClosedError`."""
        if self.closed:
            return
        if self._encoder is not None:
            self._encoder.stop()  # from now on the Python methods say it is closed
        try:
            self._flush_buffer()
        finally:
            self._buf = _ClosedBuffer()
            self._counter_last = _NoLastValues()
            try:
                self._file.close()
            except OSError as exc:
                raise TraceWriteError(f"cannot close trace file {self.path}: {exc}") from exc

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


#: Set TRACER_PURE_PYTHON=1 to write without the C encoder (it is used when built).
PURE_PYTHON_ENV = "TRACER_PURE_PYTHON"


def use_speedups() -> bool:
    """Whether new writers take the C encoder: built, and not turned off by the environment."""
    return _speedups is not None and os.environ.get(PURE_PYTHON_ENV, "") in ("", "0")


def _open_for_writing(path: Path) -> Any:
    parent = path.parent
    if not parent.is_dir():
        raise TraceWriteError(
            f"cannot create trace file {path}: folder {parent} does not exist"
            if not parent.exists()
            else f"cannot create trace file {path}: {parent} is not a folder"
        )
    if path.is_dir():
        raise TraceWriteError(f"cannot create trace file {path}: it is a folder")
    try:
        return open(path, "wb", buffering=0)
    except OSError as exc:
        raise TraceWriteError(f"cannot create trace file {path}: {exc.strerror or exc}") from exc


def _len_prefixed(payload: bytes) -> bytes:
    return varint(len(payload)) + payload


def _timestamp_type_error(ts: object) -> InvalidArgumentTypeError:
    """What a timestamp that is not an int gets (a float from a clock, say).

    The hot path does not check types: it finds out when encoding the delta,
    before anything is buffered or the clock moves, and raises this instead.
    """
    return InvalidArgumentTypeError(
        f"a timestamp must be an int (in the writer's time unit), got "
        f"{type(ts).__name__} {ts!r}"
    )


def _check_name(name: object) -> None:
    if not isinstance(name, str):
        raise InvalidArgumentTypeError(f"a name must be a str, got {type(name).__name__}")


def _check_id(what: str, value: object, limit: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < limit:
        raise InvalidArgumentError(f"{what} must be a positive int below {limit}, got {value!r}")


def _check_rank(rank: object) -> None:
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < (1 << 31):
        raise InvalidArgumentError(f"rank must be an int in 0..2**31-1, got {rank!r}")


def _check_flow(flow: object) -> int:
    if not isinstance(flow, int) or isinstance(flow, bool) or not 0 < flow <= _UINT64_MAX:
        raise InvalidArgumentError(f"a flow id must be a positive 64-bit int, got {flow!r}")
    return flow


def _flow_fields(flows: Iterable[int] | None, terminating_flows: Iterable[int] | None) -> bytes:
    """TrackEvent.flow_ids (47) and terminating_flow_ids (48), each id checked."""
    out = b""
    for flow in flows or ():
        out += field_fixed64(47, _check_flow(flow))
    for flow in terminating_flows or ():
        out += field_fixed64(48, _check_flow(flow))
    return out


# ------------------------------------------------------------ counter sequences

#: trace_processor reads at most this many extra_counter_values per event.
_MAX_EXTRA_COUNTERS = 8


def _varint_value(data: bytes, pos: int) -> int:
    """The varint at ``data[pos:]``."""
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value
        pos += 1
        shift += 7


class CounterSequence:
    """Samples of a few counter tracks on a packet sequence of their own.

    Made by :meth:`TraceWriter.counter_sequence`. The sequence has its own
    ``trusted_packet_sequence_id``, cleared incremental state, a ClockSnapshot
    whose clock 64 is incremental in units of ``time_unit_ns`` (anchored at the
    first sample), and packet defaults ``timestamp_clock_id=64`` and
    ``track_event_defaults{track_uuid: tracks[0], extra_counter_track_uuids:
    tracks[1:]}``. The setup packet is written with the first sample.

    :meth:`sample` writes one COUNTER event for the tracks whose value changed
    (a value equal to the track's previous one is not written):

    * the first track and a leading run of the others: ``48 04 F0 01 <v0>
      60 <v1> 60 <v2>...`` (the track uuids come from the defaults);
    * otherwise the first changed track is named (``58 <uuid>``) and the rest
      listed in ``extra_counter_track_uuids`` (~3 bytes more per track).

    An event with only extra values is not possible: trace_processor drops a
    COUNTER event without ``counter_value``, extras included.

    Timestamps are delta-encoded while they do not go back in time (at the
    unit's resolution); an earlier sample is written with an absolute BOOTTIME
    timestamp in ns (~9 bytes more) and leaves the delta chain alone. Values
    are the tracks' stored integers (before ``unit_multiplier``).
    """

    # No __slots__: with the C encoder, ``sample`` is an instance attribute (the
    # C method), and the state it shares with the Python code lives in __dict__.

    def __init__(
        self,
        writer: TraceWriter,
        sequence_id: int,
        tracks: tuple[CounterTrack, ...],
        time_unit_ns: int,
    ) -> None:
        self._writer = writer
        self.sequence_id = sequence_id
        self.tracks = tracks
        self.time_unit_ns = time_unit_ns
        self._seq = b"\x50" + varint(sequence_id)
        self._uuids = [varint(t.uuid) for t in tracks]
        self._extra_uuids = [b"\xf8\x01" + u for u in self._uuids]
        self._last: list[int | None] = [None] * len(tracks)
        self._last_units: int | None = None  # None until the setup packet is written
        #: Values written (a packet carries one or more).
        self.samples_written = 0
        encoder = writer._encoder
        if encoder is not None and type(self).sample is CounterSequence.sample:
            self.__dict__["sample"] = _speedups.Sequence(self, encoder).sample

    def _setup(self, ts: int) -> None:
        """The sequence's first packet: clear, defaults, clock snapshot anchored at ``ts``."""
        unit = self.time_unit_ns
        t0 = max(ts, 0) // unit
        clock64 = field_varint(1, _CLOCK_INCREMENTAL) + field_varint(2, t0) + field_varint(3, 1)
        if unit != 1:
            clock64 += field_varint(4, unit)
        clocks = field_bytes(
            1, field_varint(1, _CLOCK_BOOTTIME) + field_varint(2, t0 * unit)
        ) + field_bytes(1, clock64)
        event_defaults = field_varint(11, self.tracks[0].uuid) + b"".join(
            field_varint(31, t.uuid) for t in self.tracks[1:]
        )
        defaults = field_varint(58, _CLOCK_INCREMENTAL) + field_bytes(11, event_defaults)
        self._writer._buf += packet(
            field_bytes(6, clocks)  # clock_snapshot
            + self._seq
            + field_varint(13, 1)  # sequence_flags = SEQ_INCREMENTAL_STATE_CLEARED
            + field_bytes(59, defaults)  # trace_packet_defaults
        )
        self._last_units = t0

    def sample(self, ts: int, *values: int | None) -> None:
        """Sample the tracks at ``ts`` (ns): one value per track, in order; None skips a track."""
        n = len(self._uuids)
        if len(values) != n:
            raise InvalidArgumentError(
                f"expected {n} values (one per track, None to skip), got {len(values)}"
            )
        last = self._last
        changed: list[tuple[int, int]] = []
        for i, value in enumerate(values):
            if value is None or value == last[i]:
                continue
            if value.__class__ is not int:
                if not isinstance(value, int) or isinstance(value, bool):
                    raise InvalidArgumentTypeError(
                        f"a counter value must be an int, got {type(value).__name__}"
                    )
                value = int(value)
            if not _INT64_MIN <= value <= _INT64_MAX:
                raise ValueOutOfRangeError(f"counter value {value} does not fit in int64")
            changed.append((i, value))
        if not changed:
            return
        if ts.__class__ is not int or ts < 0:
            raise InvalidArgumentError(f"a timestamp must be a non-negative int, got {ts!r}")
        first, value0 = changed[0]
        event = b"\x48\x04" if first == 0 else b"\x48\x04\x58" + self._uuids[first]
        event += b"\xf0\x01" + varint(value0)
        rest = changed[1:]
        if rest and (first != 0 or rest[-1][0] != len(rest)):
            # Not a leading run of the default extra tracks: name them.
            event += b"".join(self._extra_uuids[i] for i, _ in rest)
        for _, value in rest:
            event += b"\x60" + varint(value)
        if self._last_units is None:
            self._setup(ts)
        units = ts // self.time_unit_ns
        body = self._seq + b"\x5a" + varint(len(event)) + event
        last_units = self._last_units
        assert last_units is not None
        if units >= last_units:
            inner = body + _TS_TAG + varint(units - last_units)
            self._last_units = units
        else:
            inner = body + _ABSOLUTE_CLOCK + _TS_TAG + varint(ts)
        writer = self._writer
        writer._buf += b"\x0a" + varint(len(inner)) + inner
        for i, value in changed:
            last[i] = value
        self.samples_written += len(changed)
        if len(writer._buf) >= writer._limit:
            writer._flush_buffer()


# Padding uses TracePacket fields 14 and 15, which Perfetto leaves unused:
# readers skip unknown fields.
_PAD_VARINT = b"\x70\x00"  # field 14, varint 0: two bytes
_PAD_BYTES_TAG = b"\x7a"  # field 15, length-delimited


def _padding(size: int) -> bytes:
    """``size`` bytes that readers skip: packets holding only unknown fields.

    A single byte is a packet tag with no length, which readers treat as a
    truncated last packet.
    """
    if size <= 0:
        return b""
    if size == 1:
        return b"\x0a"
    for body_len in range(size - 2, -1, -1):
        head = b"\x0a" + varint(body_len)
        if len(head) + body_len == size and body_len != 1:  # no field is 1 byte long
            return head + _padding_body(body_len)
    # No single packet has that size (a length varint grows a byte at 128,
    # 16384, ...): an empty packet, then the rest.
    return b"\x0a\x00" + _padding(size - 2)


def _padding_body(size: int) -> bytes:
    """``size`` (0 or >= 2) bytes of unknown TracePacket fields."""
    if size == 0:
        return b""
    for inner in range(size - 2, -1, -1):
        field = _PAD_BYTES_TAG + varint(inner)
        if len(field) + inner == size:
            return field + bytes(inner)
    return _PAD_VARINT + _padding_body(size - 2)


def _arg_cache_key(key: object, value: object) -> tuple[Any, ...] | None:
    """A hashable key for an annotation worth caching (scalars, flat dicts), else None."""
    cls = value.__class__
    if cls in _SCALARS:
        if cls is float and not value:
            return None  # 0.0 == -0.0, yet they encode differently
        return (key, cls, value)
    if cls is dict and len(value) <= 8:  # type: ignore[arg-type]
        items = tuple(value.items())  # type: ignore[attr-defined]
        if all(
            k.__class__ is str and v.__class__ in _SCALARS and (v.__class__ is not float or v)
            for k, v in items
        ):
            return (key, dict, tuple((k, v.__class__, v) for k, v in items))
    return None


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

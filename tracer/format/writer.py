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
  reports a start after later events were written) land at their true time
  and leave the delta chain alone: held by :meth:`TraceWriter.in_time_order`
  and sorted, they are deltas on a second clock (:mod:`._late`); otherwise
  they carry an absolute BOOTTIME timestamp.

Timestamps are nanoseconds in the domain of ``clock`` (``time.time_ns`` by
default, the one clock that all the nodes of a cluster share), recorded at a
resolution of ``time_unit_ns`` (1 ns by default).

The writer is not thread-safe: serialise calls from several threads yourself
(the Ray layer does).

The class is built in layers, one module each: the file and its buffer
(:mod:`._output`), track declarations (:mod:`._declare`), the slow path of
event encoding (:mod:`._events`), late events in time order (:mod:`._late`),
and here the public event calls and their hot path; the bytes themselves
are framed by :mod:`._encoding`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tracer._env import env_flag
from tracer.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    UnknownTrackError,
    ValueOutOfRangeError,
)
from tracer.format._encoding import (
    _BEGIN,
    _CLOCK_BOOTTIME,
    _CLOCK_INCREMENTAL,
    _CLOCK_REALTIME,
    _DOUBLE,
    _END,
    _INSTANT,
    _INT64_MAX,
    _INT64_MIN,
    _MAX_EXTRA_COUNTERS,
    _MAX_TIME_UNIT_NS,
    _MISSING,
    _TS_TAG,
    _VARINT_CONT2,
    _VT,
    DEFAULT_INTERN_LIMIT,
    ChildOrdering,
    CounterUnit,
    _ClosedBuffer,
    _Frames,
    _NoLastValues,
    _timestamp_type_error,
    _varint_value,
)
from tracer.format._events import _ForwardClock
from tracer.format._late import _LateEvents
from tracer.format._wire import field_bytes, field_varint, packet, varint
from tracer.format.counter_sequence import CounterSequence
from tracer.format.tracks import CounterTrack, Track

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

class TraceWriter(_LateEvents):
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

    ``clock`` (ns) times the events given no timestamp, and :meth:`now`. Its
    readings are held at the latest when it goes back (a wall clock stepped
    back by NTP): a slice cannot end before it began. Timestamps given are
    written as given.
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
        if time_unit_ns != 1:
            from tracer.format._coarse import _coarse_class

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
        super().__init__(
            path, compress=compress, compression_level=compression_level,
            buffer_size=buffer_size, sequence_id=sequence_id, clock=clock,
            intern_limit=intern_limit, time_unit_ns=time_unit_ns,
        )
        start = clock()
        #: Where the trace's clock starts, in ns (rounded down to ``time_unit_ns``).
        self.start_ts = start - start % time_unit_ns
        self._last = start // time_unit_ns  # the delta chain, in units
        if isinstance(self._clock, _ForwardClock) and self._last.__class__ is int:
            self._clock.last = self._last  # its readings start here
        self._write_setup_packet(time.time_ns() if clock is not time.time_ns else start)
        self._encoder: Any = None
        if _speedups is not None and use_speedups():
            self._accelerate(realtime_clock=clock is time.time_ns)
        if time_unit_ns == 1 and type(self).now is TraceWriter.now:
            self.__dict__["now"] = self._clock  # the same reading, one call fewer (a hot call)

    def _accelerate(self, realtime_clock: bool) -> None:
        """Route begin/end/instant/counter through the C encoder (tracer.format._speedups).

        It writes the bytes these Python methods would, into the same buffer,
        with the same caches, and hands them every call it does not take.
        A subclass that overrides one of the methods keeps its own.
        """
        base: type[TraceWriter] = TraceWriter
        if self.time_unit_ns != 1:
            from tracer.format._coarse import _CoarseTraceWriter

            base = _CoarseTraceWriter
        encoder = _speedups.Encoder(self, realtime_clock=realtime_clock)
        for name in ("begin", "end", "instant", "counter"):
            if getattr(type(self), name) is getattr(base, name):
                self.__dict__[name] = getattr(encoder, name)
        if realtime_clock:
            # The encoder reads the wall clock itself, never going back (as
            # _ForwardClock does): now() reads it there too, one reading for both.
            self._clock = encoder.clock
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
    # first occurrence, args or flows) goes through _emit or _event. Where the
    # C encoder is built it replaces begin/end/instant/counter (_accelerate);
    # this is the path without it. begin, end and instant share _put: the
    # call costs ~80 ns an event in a tight loop, and bench_format's plain
    # stream 0.57 -> 0.59 µs an event (interleaved runs), which three copies
    # of the same 25 lines saved.

    def _put(self, frames: _Frames, ts: int) -> None:
        """Buffer a cached event's prebuilt frame (by the size of its delta) and the delta.

        ``frames`` are the event's packet framed ahead for a delta of one, two
        and three varint bytes, and the packet without its timestamp (``_emit``
        frames it for any other ``ts``): see ``_frames``.
        """
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
        self._put(frames, self._clock() if ts is None else ts)

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
        self._put(frames, self._clock() if ts is None else ts)

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
        self._put(frames, self._clock() if ts is None else ts)

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
            self._close_file()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


#: Set TRACER_PURE_PYTHON=1 to write without the C encoder (it is used when built).
PURE_PYTHON_ENV = "TRACER_PURE_PYTHON"


def use_speedups() -> bool:
    """Whether new writers take the C encoder: built, and not turned off by the environment."""
    return _speedups is not None and not env_flag(PURE_PYTHON_ENV, False)

"""Encoding events off the cached path: args, flows, interning, late timestamps.

The writer's hot path (:meth:`~tracer.format.TraceWriter.begin` and the
others) appends bodies framed ahead; everything else comes here: an event
seen for the first time (validated, its name and category interned, its
body cached for next time), one with annotations or flows, one whose
timestamp is late or far from the last (on the late chain, see
:mod:`._late`, or absolute; or with a long delta). Annotation names and
repeated string values are interned per sequence; what an event interned is
forgotten if it fails, so no iid is ever used without its definition in the
trace.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tracer.errors import InvalidArgumentError, InvalidArgumentTypeError, UnknownTrackError
from tracer.format._declare import _TrackDeclarations
from tracer.format._encoding import (
    _ABSOLUTE_CLOCK,
    _ARG_CACHE_LIMIT,
    _BEGIN,
    _BODY_CACHE_LIMIT,
    _DOUBLE,
    _END,
    _INSTANT,
    _INT64_MAX,
    _INT64_MIN,
    _MAX_INTERNED_VALUE_LEN,
    _SEEN_ONCE_LIMIT,
    _TS_TAG,
    _UINT64_MAX,
    _VT,
    MAX_ARG_DEPTH,
    _arg_cache_key,
    _check_name,
    _flow_fields,
    _Frames,
    _frames,
    _timestamp_type_error,
)
from tracer.format._wire import (
    VARINT_TABLE,
    field_bytes,
    field_double,
    field_string,
    field_varint,
    varint,
)
from tracer.format.tracks import CounterTrack, Track

__all__: list[str] = []


class _ForwardClock:
    """The writer's clock in its time unit, never going back.

    A wall clock can step back (NTP correcting it, a VM resumed). Events
    timed by the writer's own readings would then go back too, and a slice
    begun before the step would end before it began: trace_processor matches
    that END to nothing and leaves the BEGIN open, and every later slice of
    the track nests in it. A reading earlier than the latest is taken as the
    latest until the clock catches up: the events of that while are drawn at
    one time, nested as they were written. Timestamps given to the writer are
    not touched. (The C encoder does the same for ``time.time_ns``, which it
    reads itself: ``Encoder.clock``.)
    """

    __slots__ = ("_read", "_unit", "last")

    def __init__(self, read: Callable[[], int], unit: int) -> None:
        self._read = read
        self._unit = unit
        self.last = 0

    def __call__(self) -> int:
        t = self._read()
        if self._unit != 1:
            t = t // self._unit
        if t.__class__ is int:  # anything else is the encoding's to reject, as it was
            if t < self.last:
                return self.last
            self.last = t
        return t


class _EventEncoding(_TrackDeclarations):
    """The event-encoding part of :class:`~tracer.format.TraceWriter` (its slow path)."""

    #: The delta chain: the last timestamp written relative, in the writer's time unit.
    _last: int
    #: The late chain (see :mod:`._late`): the last timestamp written on it, in
    #: units; -1 while it is not anchored. Its clock id field is ``_late_tag``.
    _late: int
    _late_tag: bytes

    def __init__(
        self, path: str | os.PathLike[str], *, compress: bool, compression_level: int,
        buffer_size: int, sequence_id: int, clock: Callable[[], int], intern_limit: int,
        time_unit_ns: int,
    ) -> None:
        super().__init__(
            path, compress=compress, compression_level=compression_level,
            buffer_size=buffer_size, sequence_id=sequence_id,
        )
        #: The resolution timestamps are recorded at; the hot path works in these units.
        self.time_unit_ns = time_unit_ns
        self._clock: Callable[[], int] = _ForwardClock(clock, time_unit_ns)
        self._intern_limit = intern_limit
        self._next_flow = 1
        self._late = -1
        self._late_tag = b""
        self._late_anchors: dict[int, int] = {}
        # Hot-path caches (see begin/end/instant/counter): keyed by track first,
        # then by name (or (name, category)), so a lookup allocates nothing.
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

    def _emit(self, ts: int, body: bytes) -> None:
        """Frame and buffer one timestamped packet: a delta, or late (late chain, absolute)."""
        try:  # encoded before any state changes: a bad ts leaves the writer as it was
            delta = ts - self._last
            if 0 <= delta < 16384:
                inner = body + _TS_TAG + _VT[delta]
                self._last = ts
            elif delta >= 0:
                inner = body + _TS_TAG + varint(delta)
                self._last = ts
            elif 0 <= self._late <= ts:  # behind the chain, not behind the late chain
                inner = body + self._late_tag + _TS_TAG + varint(ts - self._late)
                self._late = ts
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

"""Late events in time order, on a second delta clock of the writer's sequence.

Why: producers draw many events late. A Ray runner's tracer writes a task's
execution when the runner receives the task, and Ray's own events of a task
a second after it ran. Behind the writer's delta chain (clock 64), each such
timestamp used to be written absolute (BOOTTIME in ns: ~9 bytes, ~5 once
compressed, against 1-2 for a delta), and in a Ray run they are more than
half of the events.

:meth:`_LateEvents.in_time_order` holds the events written inside it and
writes them in time order when it exits. The ones behind the delta chain go
on the *late chain*: a second incremental clock of the sequence (a
sequence-scoped clock, 65-127) whose timestamps are deltas again. A batch
that starts behind the late chain re-anchors it with a ClockSnapshot at the
batch's earliest event (~20 bytes, once per batch). Outside a batch, an
event behind the delta chain goes on the late chain when it is not behind
that too, and is written absolute otherwise, as before.

What trace_processor does with this (checked with v58.2, and what
:mod:`._clocks` reads the same way):

* a ClockSnapshot that lists an incremental clock resets it to the value
  given; the clocks it does not list (the delta chain's 64) go on as they
  were;
* the trace clock may not go back between two snapshots of the same set of
  clocks (the later one is rejected: ``invalid_clock_snapshots``), so an
  anchor earlier than its clock's last anchor takes another clock id; there
  are 63, reused in turn, and when none is free the batch's early events are
  written absolute;
* events of one timestamp are read in the order of the file. So the batch
  never reorders the events of one track: each track's are merged by time
  with the other tracks', in the order they were written (a producer knows
  how its slices nest: one that ends where the next begins stays before it).
  A track whose events go back in time leaves the ones behind the late chain
  absolute, as without a batch; what trace_processor reads is the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any

from tracer.errors import InvalidArgumentError
from tracer.format._encoding import _timestamp_type_error
from tracer.format._events import _EventEncoding
from tracer.format._wire import CLOCK_BOOTTIME, field_bytes, field_varint, packet

__all__: list[str] = []

#: The late chain's clock ids: the sequence-scoped ones after the delta chain's 64.
_FIRST_LATE_CLOCK = 65
_LAST_LATE_CLOCK = 127
_N_LATE_CLOCKS = _LAST_LATE_CLOCK - _FIRST_LATE_CLOCK + 1
_MISSING = object()
_END = object()  # hold_call's ``what`` for end, which has none
#: A block holds at most this many calls (~15 MB): past it, what it held is written.
_MAX_HELD = 65536

#: A held call: (sort key, ts, the writer's method, its positional args, keyword args).
_Call = tuple[int, int, Callable[..., None], tuple[Any, ...], dict[str, Any]]


class _LateEvents(_EventEncoding):
    """The late chain and :meth:`in_time_order` (part of :class:`~tracer.format.TraceWriter`)."""

    #: The calls held by the batch under way (None: none is).
    _held: list[_Call] | None = None
    #: The clock id the late chain is on (0: never anchored).
    _late_clock = 0
    #: Each late clock's last anchor, in units (its snapshots may not go back).
    _late_anchors: dict[int, int]

    @contextlib.contextmanager
    def in_time_order(self) -> Iterator[None]:
        """Hold the events written in the block; write them in time order when it exits.

        For events drawn late (measured elsewhere, reported after later
        events were written): in time order, the ones behind the trace's
        delta chain go on a second one (see the module doc) at 1-2 bytes a
        timestamp instead of ~9. ``begin``, ``end``, ``instant`` and
        ``counter`` are held; a timestamp left out is read from the clock at
        the call. Each track's events keep the order they were written in
        (merged by time with the other tracks'): write a track's in time
        order, as its slices nest.

        A timestamp that is not an int, or is negative, raises at the call
        (nothing is held). Anything else the writer rejects raises when the
        held events are written, and the ones after it are dropped; when the
        block itself raised, what it held is still written. Blocks may nest:
        the outermost one writes. Held events are written when the block
        exits, or, to bound memory, each time ``_MAX_HELD`` of them wait (at
        the call that met the limit).
        """
        if self._held is not None:
            yield
            return
        held: list[_Call] = []
        keys: dict[Any, int] = {}  # per track, the latest timestamp held
        holders = self._holders(held, keys)
        names = ("begin", "end", "instant", "counter")
        encoder = self._encoder_of(names)
        if encoder is not None:
            # The C encoder holds the calls itself, as the holders would, and hands them
            # what it does not take: holding a call costs about half as much, and what is held is
            # out of the cycle collector's sight (benchmarks/README.md: in a level-1 Ray
            # run, the driver's collections went from ~28 to ~11 µs a task).
            encoder.hold(held, keys, holders, self._write_held, _MAX_HELD)
            self._held = held
            try:
                yield
            finally:
                encoder.unhold()
                self._held = None
                self._write_held(held)
            return
        saved = {name: self.__dict__.get(name, _MISSING) for name in names}
        self.__dict__.update(zip(names, holders, strict=True))
        self._held = held
        try:
            yield
        finally:
            for name, method in saved.items():
                if method is _MISSING:
                    del self.__dict__[name]
                else:
                    self.__dict__[name] = method
            self._held = None
            self._write_held(held)

    def _encoder_of(self, names: tuple[str, ...]) -> Any:
        """The C encoder, when it makes every one of these calls (no subclass overrides one)."""
        encoder = getattr(self, "_encoder", None)
        if encoder is None or not hasattr(encoder, "hold"):
            return None
        for name in names:
            if getattr(self.__dict__.get(name), "__self__", None) is not encoder:
                return None
        return encoder

    def _holders(self, held: list[_Call], keys: dict[Any, int]) -> tuple[Callable[..., None], ...]:
        """Stand-ins for begin, end, instant and counter that hold their calls.

        Each call is held with its sort key: its timestamp, or the latest
        before it on its track if that is later (so that a sort by key keeps
        each track's order). With the C encoder they hold only the calls it
        hands over (see :meth:`in_time_order`), so one shared body costs
        nothing that matters; the pure-Python writer holds every call here.
        """
        writer: Any = self  # a TraceWriter: the methods are its own
        now = writer.now
        begin, end, instant, counter = writer.begin, writer.end, writer.instant, writer.counter
        append = held.append
        write_held = self._write_held

        def hold_call(
            method: Callable[..., None], track: Any, what: Any, ts: Any, kw: dict[str, Any]
        ) -> None:
            # ``what``: the name or value of begin, instant and counter; _END for end's.
            if ts is None:
                ts = now()
            elif ts.__class__ is not int:
                _check(ts)
            args = (track, ts) if what is _END else (track, what, ts)
            try:
                last = keys.get(track, -1)
            except TypeError:  # an unhashable track: the writer says what is wrong, now
                method(*args, **kw)
                return
            if ts < 0:
                raise InvalidArgumentError(f"timestamp {ts} is negative")
            if last <= ts:
                keys[track] = last = ts
            append((last, ts, method, args, kw))
            if len(held) >= _MAX_HELD:
                write_held(held)

        def holding(method: Callable[..., None], second: str) -> Callable[..., None]:
            """A stand-in for a method of (track, name or value, ts)."""

            def hold(track: Any, what: Any = _MISSING, ts: Any = None, **kw: Any) -> None:
                if what is _MISSING:  # given by keyword (name=, value=)
                    if second not in kw:
                        raise TypeError(f"{method.__name__}() is missing {second!r}")
                    what = kw.pop(second)
                hold_call(method, track, what, ts, kw)

            return hold

        def hold_end(track: Any, ts: Any = None, **kw: Any) -> None:
            hold_call(end, track, _END, ts, kw)

        return (holding(begin, "name"), hold_end, holding(instant, "name"),
                holding(counter, "value"))

    def _write_held(self, held: list[_Call]) -> None:
        """Write the held calls in order of their keys, and empty the list.

        Also when ``_MAX_HELD`` wait, in the middle of a block (memory stays
        bounded): every call held until then is written, so each track's
        order still holds.
        """
        if not held:
            return
        held.sort(key=itemgetter(0))  # stable: each track's calls keep their order
        first = held[0][1] // self.time_unit_ns
        if first < self._last and not 0 <= self._late <= first:
            self._anchor_late(first)
        calls = held[:]
        held.clear()
        encoder = getattr(self, "_encoder", None)
        if encoder is not None and hasattr(encoder, "replay"):
            encoder.replay(calls)  # the same calls, made from C
            return
        for _, _, method, args, kw in calls:
            if kw:
                method(*args, **kw)
            else:
                method(*args)

    def _anchor_late(self, units: int) -> None:
        """Anchor the late chain at ``units`` with a ClockSnapshot, on a clock that may take it."""
        anchors = self._late_anchors
        clock = self._late_clock or _FIRST_LATE_CLOCK
        for _ in range(_N_LATE_CLOCKS):
            if anchors.get(clock, -1) <= units:
                break
            clock = clock + 1 if clock < _LAST_LATE_CLOCK else _FIRST_LATE_CLOCK
        else:
            return  # every late clock was anchored later: these events are written absolute
        unit = self.time_unit_ns
        late = field_varint(1, clock) + field_varint(2, units) + field_varint(3, 1)
        if unit != 1:
            late += field_varint(4, unit)  # unit_multiplier_ns
        clocks = field_bytes(
            1, field_varint(1, CLOCK_BOOTTIME) + field_varint(2, units * unit)
        ) + field_bytes(1, late)
        self._buf += packet(field_bytes(6, clocks) + self._seq)  # clock_snapshot
        anchors[clock] = units
        self._late_clock = clock
        self._late_tag = b"\xd0\x03" + bytes((clock,))
        self._late = units


def _check(ts: Any) -> None:
    """A timestamp that is not exactly an int: an int subclass (a bool) passes, as in
    the writer; anything else raises what the writer would."""
    if not isinstance(ts, int):
        raise _timestamp_type_error(ts)

"""Counter samples on a packet sequence of their own, for counters measured elsewhere."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracer.errors import InvalidArgumentError, InvalidArgumentTypeError, ValueOutOfRangeError
from tracer.format._encoding import (
    _ABSOLUTE_CLOCK,
    _CLOCK_BOOTTIME,
    _CLOCK_INCREMENTAL,
    _INT64_MAX,
    _INT64_MIN,
    _TS_TAG,
)
from tracer.format._wire import field_bytes, field_varint, packet, varint
from tracer.format.tracks import CounterTrack

if TYPE_CHECKING:
    from tracer.format.writer import TraceWriter

__all__ = ["CounterSequence"]


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
            from tracer.format import _speedups  # built: the writer has an encoder

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

"""Packet timestamps in trace time, as trace_processor's clock tracker converts them.

A packet's timestamp may be on the trace clock, on a global clock that a
ClockSnapshot relates to it, or on a sequence-scoped clock (64-127, often
incremental: each packet carries a delta) anchored by its sequence's last
snapshot. A timestamp that cannot be converted drops the packet (with a
``bad_timestamp`` problem), as trace_processor does. The replays' fast path
(:meth:`tracer.format._tokenizer._Tokenizer.replay` and the C one in
``_readspeedups.c``) inline the common case of :meth:`_ClockReader.convert`:
change one, change them all.
"""

from __future__ import annotations

from typing import NoReturn

from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.format._framing import _Framer
from tracer.format._sequence import _Sequence, _Skip
from tracer.format._wire import CLOCK_BOOTTIME, INT64_MAX, INT64_MIN

__all__: list[str] = []

_BOOTTIME = CLOCK_BOOTTIME
_INT64_MIN = INT64_MIN
_INT64_MAX = INT64_MAX


class _ClockReader(_Framer):
    """The framer plus the trace's clocks: snapshots in, trace-time timestamps out."""

    def __init__(self, what: str, strict: bool, max_bundle_size: int, max_inflated: int) -> None:
        super().__init__(what, strict, max_bundle_size, max_inflated)
        self.trace_clock = _BOOTTIME
        self.converted_any = False
        self.global_snapshots: list[dict[int, tuple[int, int]]] = []

    def clock_snapshot(
        self, snapshot: pb.ClockSnapshot, seq_id: int, seq: _Sequence | None
    ) -> None:
        clocks: dict[int, tuple[int, int, bool]] = {}
        global_clocks: dict[int, tuple[int, int]] = {}
        for clock in snapshot.clocks:
            clock_id = clock.clock_id
            multiplier = clock.unit_multiplier_ns or 1
            ns = clock.timestamp * multiplier
            if 64 <= clock_id < 128:
                if seq is None:
                    self.problem(
                        "bad_timestamp",
                        f"a ClockSnapshot with sequence-scoped clock {clock_id} but no sequence "
                        "id (a fatal error in trace_processor)",
                    )
                    continue
                clocks[clock_id] = (ns, multiplier, clock.is_incremental)
            else:
                clocks[clock_id] = (ns, multiplier, False)
                global_clocks[clock_id] = (ns, multiplier)
        if not self.converted_any:
            if snapshot.primary_trace_clock:
                self.trace_clock = int(snapshot.primary_trace_clock)
            elif _BOOTTIME in global_clocks and 11 not in global_clocks:
                self.trace_clock = _BOOTTIME
        if global_clocks:
            self.global_snapshots.append(global_clocks)
        if seq is not None and seq_id:
            self._sequence_snapshot(seq, clocks)

    def _sequence_snapshot(self, seq: _Sequence, clocks: dict[int, tuple[int, int, bool]]) -> None:
        """A snapshot on ``seq``: its clocks (re)start at the values given; the others go on.

        trace_processor keeps a sequence-scoped clock that a later snapshot
        does not list (a writer's delta chain, while a second incremental
        clock is re-anchored: :mod:`tracer.format._late`). When both
        snapshots name the trace clock, the new one's clocks are rebased onto
        the sequence's first snapshot, so one anchor still converts them all;
        otherwise the new snapshot replaces the old.
        """
        old = seq.snapshot
        now = clocks.get(self.trace_clock)
        then = old.get(self.trace_clock)
        if now is None or then is None:
            seq.snapshot = clocks
            seq.running = {cid: ns for cid, (ns, _, incr) in clocks.items() if incr}
            seq.anchor_epoch = -1
            return
        shift = now[0] - then[0]  # the new snapshot's instant, after the old one's
        merged = dict(old)
        for cid, (ns, multiplier, incremental) in clocks.items():
            if 64 <= cid < 128:
                merged[cid] = (ns - shift, multiplier, incremental)
                if incremental:
                    seq.running[cid] = ns
                else:
                    seq.running.pop(cid, None)
        seq.snapshot = merged

    def timestamp(self, packet: pb.TracePacket, seq_id: int, seq: _Sequence | None) -> int:
        """The packet's timestamp in trace time (advancing incremental clocks); or _Skip."""
        clock = packet.timestamp_clock_id
        if not clock and seq is not None:
            clock = seq.clock_default
        return self.convert(packet.timestamp, clock, seq_id, seq)

    def convert(self, raw: int, clock: int, seq_id: int, seq: _Sequence | None) -> int:
        """``raw`` on ``clock`` (0: none) in trace time; raises _Skip if it cannot be."""
        self.converted_any = True
        if not clock or clock == self.trace_clock:
            ts = raw
        elif 64 <= clock < 128:
            if seq is None:
                self.fail_timestamp(f"sequence-scoped clock {clock} without a sequence id")
            entry = seq.snapshot.get(clock)
            if entry is None:
                self.fail_timestamp(f"clock {clock} has no ClockSnapshot on sequence {seq_id}")
            base_ns, multiplier, incremental = entry
            if incremental:
                value = seq.running[clock] + raw * multiplier
                seq.running[clock] = value
            else:
                value = raw * multiplier
            # Where the sequence's snapshot is in trace time: cached until the sequence
            # gets a new snapshot or the trace a new global one (it may relate the clocks).
            if seq.anchor_epoch == len(self.global_snapshots):
                anchor = seq.anchor
            else:
                anchor = seq.anchor = self.snapshot_trace_time(seq.snapshot)
                seq.anchor_epoch = len(self.global_snapshots)
            if anchor is None:
                self.fail_timestamp(
                    f"the ClockSnapshot of clock {clock} has no path to the trace clock "
                    f"{self.trace_clock}"
                )
            ts = anchor + value - base_ns
        else:
            converted = self.global_to_trace(clock, raw)
            if converted is None:
                self.fail_timestamp(
                    f"no ClockSnapshot relates clock {clock} to the trace clock {self.trace_clock}"
                )
            ts = converted
        if not _INT64_MIN <= ts <= _INT64_MAX:
            self.fail_timestamp(f"timestamp {ts} does not fit in int64")
        return ts

    def fail_timestamp(self, message: str) -> NoReturn:
        self.problem("bad_timestamp", f"{message}; the packet is dropped")
        raise _Skip

    def snapshot_trace_time(self, snapshot: dict[int, tuple[int, int, bool]]) -> int | None:
        entry = snapshot.get(self.trace_clock)
        if entry is not None:
            return entry[0]
        for clock_id, (ns, multiplier, _) in snapshot.items():
            if not 64 <= clock_id < 128:
                converted = self.global_to_trace(clock_id, ns // multiplier)
                if converted is not None:
                    return converted
        return None

    def global_to_trace(self, clock: int, raw: int) -> int | None:
        target = self.trace_clock
        for snapshot in reversed(self.global_snapshots):
            entry = snapshot.get(clock)
            anchor = snapshot.get(target)
            if entry is not None and anchor is not None:
                return anchor[0] + raw * entry[1] - entry[0]
        return None

"""Decoding of memory counters with perfetto's own pb2, independently of tracer's reader.

It follows trace_processor's rules for the parts the memory counters use:
per-sequence packet defaults (timestamp clock, track_uuid,
extra_counter_track_uuids), incremental clocks with ``unit_multiplier_ns``,
absolute BOOTTIME timestamps, ``extra_counter_values``, and the counter
descriptor's ``unit_multiplier``. The tests compare it with tracer's reader.
"""

from __future__ import annotations

import dataclasses
import zlib
from pathlib import Path

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P

_BOOTTIME = 6


@dataclasses.dataclass
class _Seq:
    clock: int = 0
    track: int | None = None
    extra: list[int] = dataclasses.field(default_factory=list)
    running: dict[int, int] = dataclasses.field(default_factory=dict)
    multiplier: dict[int, int] = dataclasses.field(default_factory=dict)
    cleared: bool = False


@dataclasses.dataclass
class DecodedCounters:
    """Counter samples by track uuid, and the size of every counter packet by sequence."""

    samples: dict[int, list[tuple[int, int]]]  # uuid -> [(ts ns, value in the track's unit)]
    packet_sizes: dict[int, list[int]]  # sequence id -> [bytes of each counter packet, framed]
    values_written: dict[int, int]  # sequence id -> counter values carried
    packet_values: dict[int, list[int]]  # sequence id -> [values each counter packet carries]
    names: dict[int, str]  # counter uuid -> name
    parents: dict[int, int]  # counter uuid -> parent uuid


def decode_counters(path: str | Path) -> DecodedCounters:
    """Every counter sample of the trace, decoded with ``perfetto_trace_pb2``."""
    trace = P.Trace.FromString(Path(path).read_bytes())
    packets = []
    for outer in trace.packet:  # runner traces are compressed: open the bundles
        if outer.HasField("compressed_packets"):
            packets.extend(P.Trace.FromString(zlib.decompress(outer.compressed_packets)).packet)
        else:
            packets.append(outer)
    seqs: dict[int, _Seq] = {}
    multiplier: dict[int, int] = {}
    out = DecodedCounters({}, {}, {}, {}, {}, {})
    for pkt in packets:
        sid = pkt.trusted_packet_sequence_id
        seq = seqs.setdefault(sid, _Seq())
        if pkt.sequence_flags & 1:
            seq.clock, seq.track, seq.extra, seq.cleared = 0, None, [], True
        if pkt.HasField("trace_packet_defaults"):
            defaults = pkt.trace_packet_defaults
            seq.clock = defaults.timestamp_clock_id
            ted = defaults.track_event_defaults
            seq.track = ted.track_uuid if ted.HasField("track_uuid") else None
            seq.extra = list(ted.extra_counter_track_uuids)
        if pkt.HasField("clock_snapshot"):
            for clock in pkt.clock_snapshot.clocks:
                if clock.is_incremental:
                    mult = clock.unit_multiplier_ns or 1
                    seq.running[clock.clock_id] = clock.timestamp * mult
                    seq.multiplier[clock.clock_id] = mult
        if pkt.HasField("track_descriptor") and pkt.track_descriptor.HasField("counter"):
            desc = pkt.track_descriptor
            multiplier[desc.uuid] = desc.counter.unit_multiplier or 1
            out.names[desc.uuid] = desc.name
            out.parents[desc.uuid] = desc.parent_uuid
        if not pkt.HasField("track_event") or pkt.track_event.type != P.TrackEvent.TYPE_COUNTER:
            continue
        clock = pkt.timestamp_clock_id or seq.clock
        if clock in seq.running:
            seq.running[clock] += pkt.timestamp * seq.multiplier[clock]
            ts = seq.running[clock]
        else:
            assert clock in (0, _BOOTTIME), clock
            ts = pkt.timestamp
        event = pkt.track_event
        assert seq.cleared, "counter on a sequence that was never cleared"
        uuid = event.track_uuid if event.HasField("track_uuid") else seq.track
        assert uuid is not None and uuid in multiplier, "counter before its descriptor"
        assert event.HasField("counter_value"), "trace_processor drops a counter without value"
        out.samples.setdefault(uuid, []).append((ts, event.counter_value * multiplier[uuid]))
        extras = list(event.extra_counter_track_uuids) or seq.extra
        assert len(event.extra_counter_values) <= len(extras) <= 8
        for extra_uuid, value in zip(extras, event.extra_counter_values, strict=False):
            assert extra_uuid in multiplier, "extra counter before its descriptor"
            out.samples.setdefault(extra_uuid, []).append((ts, value * multiplier[extra_uuid]))
        out.packet_sizes.setdefault(sid, []).append(pkt.ByteSize() + 2)
        out.packet_values.setdefault(sid, []).append(1 + len(event.extra_counter_values))
        out.values_written[sid] = (
            out.values_written.get(sid, 0) + 1 + len(event.extra_counter_values)
        )
    return out

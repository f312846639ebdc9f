"""Reads native Perfetto protobuf traces into a :class:`~tracer.format.model.TraceModel`.

The reader follows trace_processor's import rules for the part of the format
tracer writes (its proto tokenizer and track event importer), so a test can check
what a trace will look like in the UI without a trace_processor binary, and
the :attr:`TraceModel.problems` list names what trace_processor would drop.

How it reads:

1. **Framing** (:mod:`tracer.format._framing`), by hand, a chunk of the
   file at a time: a file is a run of ``0A <varint length> <TracePacket>``
   records. A file that ends inside a record (a trace cut while it was being
   written) reads up to the last complete record and sets ``truncated``.
   ``compressed_packets`` bundles are inflated (zlib or gzip header, as
   trace_processor accepts) with hard caps on the inflated size, per bundle
   (``max_bundle_size``) and in all (``max_inflated_size``); a bundle over a
   cap (a zlib bomb) or a bundle inside a bundle (which crashes
   trace_processor) raises
   :class:`~tracer.errors.TraceReadError`. A record that declares more bytes
   than the file holds is a file cut while being written (``truncated``),
   unless it declares more than ``max_bundle_size``: no writer makes such a
   record, so that is damage (``bad_framing``), not a cut.
2. **Tokenizing** (:mod:`tracer.format._tokenizer`), in file order, each
   record decoded with our generated ``TracePacket`` class: per-sequence
   incremental state (interning, packet defaults,
   SEQ_INCREMENTAL_STATE_CLEARED), clock snapshots and timestamp conversion
   (delta timestamps on sequence-scoped incremental clocks such as 64,
   absolute ones on BOOTTIME or any clock a snapshot relates to the trace
   clock), track descriptors, and counter events (which, as in
   trace_processor, need their counter descriptor *earlier* in the file).
3. **Parsing** (here), in timestamp order (ties keep file order, as
   trace_processor's sorter does): slices matched BEGIN to END on a stack per track uuid,
   instants, and flows.

The input is treated as untrusted: every declared length is checked against
the bytes that are left before anything is sliced, protobuf's parser bounds
nesting (its errors become ``bad_packet`` problems), and inflation is bounded.
Time and memory grow linearly with the bytes read, inflated ones included,
so a compressed file can cost what a file up to ~1000x bigger would (zlib's
limit; a real trace of identical packets compresses ~500x, so no ratio tells
a bomb from a regular trace): for untrusted input, cap the file size and
``max_inflated_size``. Runs of empty records (a common bomb filling) are
skipped at C speed.
"""

from __future__ import annotations

import gc
import io
import os
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from tracer.errors import TraceReadError
from tracer.format._framing import Where
from tracer.format._gunzip import GZIP_MAGIC, Gunzip
from tracer.format._tokenizer import _BEGIN, _END, _Tokenizer
from tracer.format.model import CounterSample, Flow, Instant, Slice, TraceModel

__all__ = ["DEFAULT_MAX_BUNDLE_SIZE", "DEFAULT_MAX_INFLATED_SIZE", "read_trace"]

#: The most bytes one ``compressed_packets`` bundle may inflate to. The writer's
#: bundles are a few hundred KB; Perfetto asks for bundles under 512 KB.
DEFAULT_MAX_BUNDLE_SIZE = 64 * 1024 * 1024
#: The most bytes all bundles of a file may inflate to: a backstop (reading a
#: GiB of packets takes this reader minutes and many GiB of memory).
DEFAULT_MAX_INFLATED_SIZE = 1 << 30


def read_trace(
    path_or_bytes: str | os.PathLike[str] | bytes | bytearray | memoryview,
    *,
    strict: bool = False,
    max_bundle_size: int = DEFAULT_MAX_BUNDLE_SIZE,
    max_inflated_size: int = DEFAULT_MAX_INFLATED_SIZE,
) -> TraceModel:
    """Decode a Perfetto protobuf trace file (a path, or its bytes).

    With ``strict=True`` the first :class:`~tracer.format.model.Problem` raises
    :class:`~tracer.errors.TraceReadError` instead of being listed; a file cut
    inside its last packet is not a problem (see ``TraceModel.truncated``),
    but the slices it leaves open are.

    Raises :class:`~tracer.errors.TraceReadError` for a file that cannot be
    read, is empty, or is not a Perfetto protobuf trace, and for a compressed
    bundle that inflates past ``max_bundle_size`` bytes or holds another
    bundle, or bundles that inflate to more than ``max_inflated_size`` bytes
    in all.

    The model holds every slice, instant and counter: its memory grows with
    the trace (a few hundred bytes per event). :func:`tracer.format.scan_trace`
    hands them over one at a time instead.
    """
    if max_bundle_size < 1:
        raise ValueError(f"max_bundle_size must be positive, got {max_bundle_size}")
    if max_inflated_size < 1:
        raise ValueError(f"max_inflated_size must be positive, got {max_inflated_size}")
    # The reader allocates millions of small acyclic objects; the cyclic
    # garbage collector would rescan them over and over (about half the time
    # of a large read), so it is paused while reading.
    with paused_gc():
        return read_source(
            path_or_bytes,
            lambda what: _ModelReader(what, strict, max_bundle_size, max_inflated_size),
        ).model


class paused_gc:
    """Pause the cyclic garbage collector in a block (restored after)."""

    def __enter__(self) -> None:
        self.was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.was_enabled:
            gc.enable()


_R = TypeVar("_R", bound=_Tokenizer)


def read_source(
    path_or_bytes: str | os.PathLike[str] | bytes | bytearray | memoryview,
    make: Callable[[str], _R],
) -> _R:
    """Run the reader ``make(what)`` over a file (chunk by chunk) or bytes; returns the reader.

    Raises :class:`~tracer.errors.TraceReadError` for a file that cannot be read.
    """
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        reader = make("trace data")
        data = bytes(path_or_bytes)
        if data[:2] == GZIP_MAGIC:
            _read_gzip(reader, io.BytesIO(data), "trace data")
        else:
            reader.read_bytes(data)
    else:
        path = Path(path_or_bytes)
        what = f"trace file {path}"
        reader = make(what)
        try:
            f = path.open("rb")
        except OSError as exc:
            raise TraceReadError(f"cannot read {what}: {exc.strerror or exc}") from exc
        with f:
            try:
                # peek, not read: a pipe cannot seek back
                if f.peek(2)[:2] == GZIP_MAGIC:
                    _read_gzip(reader, f, what)
                else:
                    reader.read_file(f)
            except OSError as exc:  # a read error after the open (EIO, a folder...)
                raise TraceReadError(f"cannot read {what}: {exc.strerror or exc}") from exc
    reader.finish()
    return reader


def _read_gzip(reader: _Tokenizer, f: BinaryIO, what: str) -> None:
    """A gzip-compressed trace, read as the trace it holds; cut short, it is truncated."""
    stream = Gunzip(f, what)
    try:
        reader.read_file(stream)  # type: ignore[arg-type]
    except TraceReadError:
        if not stream.cut_before_anything:
            raise
    if stream.cut:
        reader.truncated = True


class _ModelReader(_Tokenizer):
    """Keeps every event, then sorts them all and builds the :class:`TraceModel`."""

    model: TraceModel

    def finish(self) -> None:
        self.finish_tokenizing()
        model = self.model = TraceModel(tracks=self.tracks)
        self.counters.sort(key=itemgetter(0))
        model.counters = [CounterSample(uuid, ts, value) for ts, uuid, value in self.counters]
        self.parse_events()
        self.report_to(model)

    # --------------------------------------------------------------- parsing

    def parse_events(self) -> None:
        """Slices, instants and flows, from the events in timestamp order."""
        events = self.events
        events.sort(key=itemgetter(0))
        tracks = self.tracks
        stacks: dict[int, list[list[Any]]] = {}
        built: list[Slice | Instant | None] = []
        active_flows: dict[int, int] = {}
        flows = self.model.flows
        reported: set[int] = set()
        for ts, _, kind, uuid, name, category, args, out, into, where in events:
            track = tracks.get(uuid)
            if track is None or track.kind == "counter":
                if uuid not in reported:
                    reported.add(uuid)
                    if track is None:
                        self.problem(
                            "undeclared_track",
                            f"events on track {uuid}, which has no descriptor, are dropped",
                            where,
                        )
                    else:
                        self.problem(
                            "slice_on_counter_track",
                            f"slice events on counter track {uuid} ({track.name!r}) are dropped",
                            where,
                        )
                continue
            stack = stacks.get(uuid)
            if stack is None:
                stack = stacks[uuid] = []
            if kind == _BEGIN:
                slice_id = len(built)
                parent = stack[-1][0] if stack else None
                # [id, ts, name, category, depth, parent, args, flows out, flows in, where]
                stack.append(
                    [
                        slice_id,
                        ts,
                        name,
                        category,
                        len(stack),
                        parent,
                        args if args is not None else {},
                        list(out),
                        list(into),
                        where,
                    ]
                )
                built.append(None)
            elif kind == _END:
                at = _closed_by_end(self.problem, stack, uuid, track.name, name, category, where)
                if at is None:
                    continue
                entry = stack.pop(at)
                slice_id = entry[0]
                if args:
                    entry[6].update(args)
                entry[7].extend(out)
                entry[8].extend(into)
                built[slice_id] = _slice_of(entry, uuid, ts - entry[1])
            else:
                slice_id = len(built)
                built.append(
                    Instant(
                        slice_id,
                        uuid,
                        name,
                        category,
                        ts,
                        len(stack),
                        stack[-1][0] if stack else None,
                        args if args is not None else {},
                        out,
                        into,
                    )
                )
            if out or into:
                for flow_id in out:
                    previous = active_flows.get(flow_id)
                    if previous is not None:
                        flows.append(Flow(flow_id, previous, slice_id))
                    active_flows[flow_id] = slice_id
                for flow_id in into:
                    previous = active_flows.pop(flow_id, None)
                    if previous is None:
                        self.problem(
                            "flow_end_without_start",
                            f"terminating flow id {flow_id} was never started; no arrow is drawn",
                            where,
                        )
                    else:
                        flows.append(Flow(flow_id, previous, slice_id))
        for uuid, stack in stacks.items():
            for entry in stack:
                slice_id = entry[0]
                built[slice_id] = _slice_of(entry, uuid, None)
                self.problem(
                    "unterminated_slice",
                    f"slice {entry[2]!r} on track {uuid} ({tracks[uuid].name!r}) never ends "
                    "(trace_processor shows it as 'Did not end')",
                    entry[9],
                )
        slices = self.model.slices
        instants = self.model.instants
        for item in built:
            if isinstance(item, Slice):
                slices.append(item)
            elif item is not None:
                instants.append(item)


def _closed_by_end(
    problem: Callable[..., None],
    stack: list[list[Any]],
    uuid: int,
    track_name: str | None,
    name: str | None,
    category: str | None,
    where: Where,
) -> int | None:
    """The index in ``stack`` of the open slice an END closes, as trace_processor matches
    it (both readers' rule); None, with the problem recorded, when it closes none."""
    if not stack:
        problem(
            "unmatched_end",
            f"an END on track {uuid} ({track_name!r}) with no open slice; ignored",
            where,
        )
        return None
    at = len(stack) - 1
    if name is not None or category is not None:
        found = _matching_open_slice(stack, name, category)
        if found is None:
            problem(
                "unmatched_end", f"an END for {name!r} on track {uuid} matches no open slice", where
            )
            return None
        at = found
    if at != len(stack) - 1:
        problem(
            "misplaced_end",
            f"an END on track {uuid} closes {stack[at][2]!r}, which is not the innermost "
            "open slice",
            where,
        )
    return at


def _matching_open_slice(
    stack: list[list[Any]], name: str | None, category: str | None
) -> int | None:
    """trace_processor's rule for an END that names its slice: the innermost open
    slice whose category equals the END's (if it has one) and whose name
    equals the END's (if both have one)."""
    for index in range(len(stack) - 1, -1, -1):
        entry = stack[index]
        if category is not None and entry[3] != category:
            continue
        if name is not None and entry[2] is not None and entry[2] != name:
            continue
        return index
    return None


def _slice_of(entry: list[Any], uuid: int, dur: int | None) -> Slice:
    """The Slice of an open-slice entry of parse_events (dur None: it never ended)."""
    return Slice(
        entry[0], uuid, entry[2], entry[3], entry[1], dur, entry[4], entry[5], entry[6],
        tuple(entry[7]), tuple(entry[8]),
    )


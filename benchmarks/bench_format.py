"""Benchmark of the trace format writer against the perfetto package and Chrome JSON.

Run by hand (it is not a test, pytest does not collect it), from the project root:

    .venv/bin/python benchmarks/bench_format.py              # speed and size (~2 min)
    .venv/bin/python benchmarks/bench_format.py --memory     # 10M-event memory check (~2 min)
    .venv/bin/python benchmarks/bench_format.py --all        # both, one summary table
    .venv/bin/python benchmarks/bench_format.py --events 50000 --repeats 3   # quick look

It exits 1 when a target is missed.

One synthetic event stream (seeded, so every run writes the same events) is
written three ways in the same process:

* ``tracer``: our :class:`tracer.format.TraceWriter` (also with ``compress=True``,
  and both again as ``tracer us`` with ``time_unit_ns=1000``: timestamps in
  microseconds, the resolution of the JSON's ``ts``);
* ``perfetto-pb2``: the perfetto package's ``TraceProtoBuilder``, filling its
  pb2 ``TracePacket`` messages the way its documentation shows (descriptors,
  a trusted sequence id, event names interned on first use), serialized to a file;
* ``json``: Chrome JSON events (``B``/``E``/``i``/``C`` phases), one
  ``json.dumps`` per event appended to a buffered file, as JSON tracers do.

The stream: slices opening and closing (properly nested, up to 4 deep) on 32
thread tracks of 4 processes, 20 task names, a few instants, counter samples on
5 counter tracks, and timestamps 1 us - 2 ms apart (log-uniform). The
timestamps are computed before timing, so clock reads are not measured: every
writer is handed the same ``ts``. Two variants:

1. ``plain``: begin/end/instant/counter without args;
2. ``mixed``: the same, but ~10% of the slices carry a few args
   (task id, function name, attempt, object id).

Each variant is written ``--repeats`` times per writer (writers interleaved,
the file closed and flushed inside the timing) and the median is reported per
event. Times are the process's CPU time (user + system, so file writes count),
which other work on a shared 2-core machine disturbs far less than wall time;
the wall-clock median is printed beside it. They include the benchmark's own
dispatch loop over the event list (its cost alone is printed as ``loop
overhead``) for every writer alike. The summary table checks the targets:

* args-free begin/end/instant/counter: <= 0.5 us/event, >= 4x faster than
  JSON and >= 2.5x faster than TraceProtoBuilder;
* args-free slice events <= 16 bytes/event; the mixed stream >= 6x smaller
  than its JSON, >= 15x with ``compress=True``, each checked with ns
  timestamps (the default: 1000x finer than the JSON's) and with µs (the
  JSON's own unit; its float ``ts`` resolves 0.25 µs at today's epoch);
* (``--memory``/``--all``) writer memory flat over a 10M-event stream.

``--memory`` streams ``--memory-events`` (10M) mixed events through one
TraceWriter (a 1M-event chunk replayed later in time, with fresh task and
object ids) and samples the process RSS and the tracemalloc-traced memory
every 1M events, to show the writer's memory does not grow.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracer.format import TraceWriter

# Event kinds in the generated stream.
BEGIN, END, INSTANT, COUNTER = 0, 1, 2, 3

N_PROCESSES = 4
THREADS_PER_PROCESS = 8
# Real OS ids, as a Ray node's worker processes have (they only cost bytes in JSON).
PIDS = [48213, 48377, 151620, 160944]


def tid_of(p: int, t: int) -> int:
    return PIDS[p] + 5 + t
N_COUNTERS = 5  # memory of each process + one "pending tasks" counter
MAX_DEPTH = 4

NAMES = [
    "dispatch", "schedule", "wave", "task", "execute", "serialize", "deserialize",
    "fetch_inputs", "put_outputs", "wait", "get", "submit", "resolve_deps",
    "spill", "restore", "gc", "shuffle_map", "shuffle_reduce", "read_parquet",
    "write_parquet",
]
FUNCTIONS = ["map_batch", "reduce", "load", "train_step", "evaluate", "preprocess", "join"]
INSTANT_NAMES = ["retry", "node_added", "oom_warning"]

# Event = (kind, track or counter index, name index, ts ns, args / counter value / None)
Event = tuple[int, int, int, int, Any]


@dataclass
class Stream:
    t0: int
    events: list[Event]

    def count(self, *kinds: int) -> int:
        return sum(1 for e in self.events if e[0] in kinds)


def make_stream(n_events: int, with_args: bool, seed: int = 1, t0: int | None = None) -> Stream:
    """A realistic, properly nested event stream of about ``n_events`` events."""
    rng = random.Random(seed)
    t0 = time.time_ns() if t0 is None else t0
    n_tracks = N_PROCESSES * THREADS_PER_PROCESS
    stacks = [0] * n_tracks
    memory = [rng.randrange(2 << 30, 6 << 30) for _ in range(N_PROCESSES)]
    pending = 50
    lo, hi = math.log(1_000), math.log(2_000_000)  # gaps: 1 us .. 2 ms, log-uniform
    events: list[Event] = []
    append = events.append
    ts = t0
    task_id = 0
    while len(events) < n_events:
        ts += int(math.exp(rng.uniform(lo, hi)))
        r = rng.random()
        if r < 0.10:  # counter sample
            c = rng.randrange(N_COUNTERS)
            if c < N_PROCESSES:
                memory[c] = max(1 << 20, memory[c] + rng.randrange(-64 << 20, 64 << 20))
                value = memory[c]
            else:
                pending = max(0, pending + rng.randrange(-5, 6))
                value = pending
            append((COUNTER, c, 0, ts, value))
            continue
        t = rng.randrange(n_tracks)
        if r < 0.13:  # instant
            append((INSTANT, t, rng.randrange(len(INSTANT_NAMES)), ts, None))
            continue
        depth = stacks[t]
        if depth == 0 or (depth < MAX_DEPTH and rng.random() < 0.5):
            args = None
            if with_args and rng.random() < 0.10:
                task_id += 1
                args = {
                    "task_id": task_id,
                    "func": rng.choice(FUNCTIONS),
                    "attempt": rng.randrange(3),
                    "object_id": f"{rng.getrandbits(64):016x}",
                }
            append((BEGIN, t, rng.randrange(len(NAMES)), ts, args))
            stacks[t] = depth + 1
        else:
            append((END, t, 0, ts, None))
            stacks[t] = depth - 1
    for t, depth in enumerate(stacks):  # close what is still open
        for _ in range(depth):
            ts += int(math.exp(rng.uniform(lo, hi)))
            append((END, t, 0, ts, None))
    return Stream(t0, events)


# ------------------------------------------------------------------ writers


def run_tracer(
    stream: Stream, path: Path, compress: bool = False, time_unit_ns: int = 1
) -> None:
    w = TraceWriter(path, compress=compress, clock=lambda: stream.t0, time_unit_ns=time_unit_ns)
    tracks = []
    counters = []
    for p in range(N_PROCESSES):
        proc = w.process_track(PIDS[p], f"node-{p + 1}")
        counters.append(
            w.counter_track(f"memory node-{p + 1}", parent=proc, unit="bytes", dedupe=False)
        )
        for t in range(THREADS_PER_PROCESS):
            tracks.append(w.thread_track(PIDS[p], tid_of(p, t), f"worker-{t}"))
    counters.append(w.counter_track("pending tasks", dedupe=False))
    names = NAMES
    inames = INSTANT_NAMES
    begin, end, instant, counter = w.begin, w.end, w.instant, w.counter
    for kind, i, n, ts, x in stream.events:
        if kind == BEGIN:
            if x is None:
                begin(tracks[i], names[n], ts)
            else:
                begin(tracks[i], names[n], ts, args=x)
        elif kind == END:
            end(tracks[i], ts)
        elif kind == COUNTER:
            counter(counters[i], x, ts)
        else:
            instant(tracks[i], inames[n], ts)
    w.close()


def run_tracer_compressed(stream: Stream, path: Path) -> None:
    run_tracer(stream, path, compress=True)


def run_tracer_us(stream: Stream, path: Path) -> None:
    run_tracer(stream, path, time_unit_ns=1000)


def run_tracer_us_compressed(stream: Stream, path: Path) -> None:
    run_tracer(stream, path, compress=True, time_unit_ns=1000)


def run_pb2(stream: Stream, path: Path) -> None:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
        CounterDescriptor,
        TracePacket,
        TrackEvent,
    )
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    seq = 1
    builder = TraceProtoBuilder()
    first = builder.add_packet()
    first.trusted_packet_sequence_id = seq
    first.sequence_flags = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    uuid = 0
    tracks: list[int] = []
    counters: list[int] = []
    for p in range(N_PROCESSES):
        uuid += 1
        proc_uuid = uuid
        pkt = builder.add_packet()
        pkt.track_descriptor.uuid = proc_uuid
        pkt.track_descriptor.process.pid = PIDS[p]
        pkt.track_descriptor.process.process_name = f"node-{p + 1}"
        uuid += 1
        pkt = builder.add_packet()
        pkt.track_descriptor.uuid = uuid
        pkt.track_descriptor.parent_uuid = proc_uuid
        pkt.track_descriptor.name = f"memory node-{p + 1}"
        pkt.track_descriptor.counter.unit = CounterDescriptor.UNIT_SIZE_BYTES
        counters.append(uuid)
        for t in range(THREADS_PER_PROCESS):
            uuid += 1
            pkt = builder.add_packet()
            pkt.track_descriptor.uuid = uuid
            pkt.track_descriptor.thread.pid = PIDS[p]
            pkt.track_descriptor.thread.tid = tid_of(p, t)
            pkt.track_descriptor.thread.thread_name = f"worker-{t}"
            tracks.append(uuid)
    uuid += 1
    pkt = builder.add_packet()
    pkt.track_descriptor.uuid = uuid
    pkt.track_descriptor.name = "pending tasks"
    pkt.track_descriptor.counter.unit = CounterDescriptor.UNIT_COUNT
    counters.append(uuid)

    name_iids: dict[str, int] = {}
    needs_state = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
    slice_begin, slice_end = TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END
    type_instant, type_counter = TrackEvent.TYPE_INSTANT, TrackEvent.TYPE_COUNTER

    def set_name(pkt: Any, name: str) -> None:
        iid = name_iids.get(name)
        if iid is None:
            iid = name_iids[name] = len(name_iids) + 1
            pkt.interned_data.event_names.add(iid=iid, name=name)
        pkt.track_event.name_iid = iid

    for kind, i, n, ts, x in stream.events:
        pkt = builder.add_packet()
        pkt.timestamp = ts
        pkt.trusted_packet_sequence_id = seq
        if kind == BEGIN:
            pkt.sequence_flags = needs_state
            pkt.track_event.type = slice_begin
            pkt.track_event.track_uuid = tracks[i]
            set_name(pkt, NAMES[n])
            if x is not None:
                for key, value in x.items():
                    ann = pkt.track_event.debug_annotations.add()
                    ann.name = key
                    if isinstance(value, str):
                        ann.string_value = value
                    else:
                        ann.int_value = value
        elif kind == END:
            pkt.track_event.type = slice_end
            pkt.track_event.track_uuid = tracks[i]
        elif kind == COUNTER:
            pkt.track_event.type = type_counter
            pkt.track_event.track_uuid = counters[i]
            pkt.track_event.counter_value = x
        else:
            pkt.sequence_flags = needs_state
            pkt.track_event.type = type_instant
            pkt.track_event.track_uuid = tracks[i]
            set_name(pkt, INSTANT_NAMES[n])
    with open(path, "wb") as f:
        f.write(builder.serialize())


def run_json(stream: Stream, path: Path) -> None:
    dumps = json.dumps
    tracks = [
        (PIDS[p], tid_of(p, t)) for p in range(N_PROCESSES) for t in range(THREADS_PER_PROCESS)
    ]
    counters = [(PIDS[p], f"memory node-{p + 1}") for p in range(N_PROCESSES)]
    counters.append((PIDS[0], "pending tasks"))
    with open(path, "w", encoding="utf-8") as f:
        write = f.write
        write("[\n")
        for p in range(N_PROCESSES):
            write(dumps({"name": "process_name", "ph": "M", "pid": PIDS[p],
                         "args": {"name": f"node-{p + 1}"}}) + ",\n")
            for t in range(THREADS_PER_PROCESS):
                write(dumps({"name": "thread_name", "ph": "M", "pid": PIDS[p],
                             "tid": tid_of(p, t), "args": {"name": f"worker-{t}"}}) + ",\n")
        for kind, i, n, ts, x in stream.events:
            us = ts / 1000
            if kind == BEGIN:
                pid, tid = tracks[i]
                event = {"name": NAMES[n], "ph": "B", "ts": us, "pid": pid, "tid": tid}
                if x is not None:
                    event["args"] = x
            elif kind == END:
                pid, tid = tracks[i]
                event = {"ph": "E", "ts": us, "pid": pid, "tid": tid}
            elif kind == COUNTER:
                pid, name = counters[i]
                event = {"name": name, "ph": "C", "ts": us, "pid": pid, "args": {"value": x}}
            else:
                pid, tid = tracks[i]
                event = {"name": INSTANT_NAMES[n], "ph": "i", "s": "t", "ts": us,
                         "pid": pid, "tid": tid}
            write(dumps(event) + ",\n")
        write("{}]\n")


def run_loop_only(stream: Stream, path: Path) -> None:
    """The benchmark's dispatch loop with no-op writer calls: its own cost."""

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    tracks = list(range(N_PROCESSES * THREADS_PER_PROCESS))
    counters = list(range(N_COUNTERS))
    names = NAMES
    inames = INSTANT_NAMES
    begin = end = instant = counter = noop
    for kind, i, n, ts, x in stream.events:
        if kind == BEGIN:
            if x is None:
                begin(tracks[i], names[n], ts)
            else:
                begin(tracks[i], names[n], ts, args=x)
        elif kind == END:
            end(tracks[i], ts)
        elif kind == COUNTER:
            counter(counters[i], x, ts)
        else:
            instant(tracks[i], inames[n], ts)
    path.write_bytes(b"")


WRITERS: dict[str, Callable[[Stream, Path], None]] = {
    "tracer": run_tracer,
    "tracer+zlib": run_tracer_compressed,
    "tracer us": run_tracer_us,
    "tracer us+zlib": run_tracer_us_compressed,
    "perfetto-pb2": run_pb2,
    "json": run_json,
    "loop overhead": run_loop_only,
}


# ------------------------------------------------------------------ measuring


@dataclass
class Result:
    events: int
    times: list[float] = field(default_factory=list)  # CPU seconds per run
    wall: list[float] = field(default_factory=list)  # wall-clock seconds per run
    size: int = 0

    @property
    def us_per_event(self) -> float:
        """Median CPU time per event (the process's user + system time)."""
        return statistics.median(self.times) / self.events * 1e6

    @property
    def wall_us_per_event(self) -> float:
        return statistics.median(self.wall) / self.events * 1e6

    @property
    def bytes_per_event(self) -> float:
        return self.size / self.events


def measure(stream: Stream, repeats: int, workdir: Path) -> dict[str, Result]:
    n = len(stream.events)
    results = {name: Result(n) for name in WRITERS}
    for _ in range(repeats):
        for name, run in WRITERS.items():  # interleaved, so drift hits all alike
            path = workdir / f"{name}.out"
            gc.collect()
            start, start_cpu = time.perf_counter(), time.process_time()
            run(stream, path)
            results[name].times.append(time.process_time() - start_cpu)
            results[name].wall.append(time.perf_counter() - start)
            results[name].size = path.stat().st_size
            path.unlink()
    return results


def size_only(stream: Stream, workdir: Path) -> int:
    path = workdir / "size.out"
    run_tracer(stream, path)
    size = path.stat().st_size
    path.unlink()
    return size


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_check(total: int, step: int, workdir: Path) -> tuple[list[tuple[int, int, int]], int]:
    """Stream ``total`` mixed events through one writer; (events, rss, traced) every ``step``."""
    # A chunk closes all its slices, so it can be repeated (shifted in time).
    chunk = make_stream(step, with_args=True, seed=7, t0=0)
    span = chunk.events[-1][3] + 1_000
    t0 = time.time_ns()
    path = workdir / "memory.out"
    w = TraceWriter(path, clock=lambda: t0)
    tracks = []
    counters = []
    for p in range(N_PROCESSES):
        proc = w.process_track(PIDS[p], f"node-{p + 1}")
        counters.append(
            w.counter_track(f"memory node-{p + 1}", parent=proc, unit="bytes", dedupe=False)
        )
        for t in range(THREADS_PER_PROCESS):
            tracks.append(w.thread_track(PIDS[p], tid_of(p, t), f"worker-{t}"))
    counters.append(w.counter_track("pending tasks", dedupe=False))
    names, inames = NAMES, INSTANT_NAMES
    begin, end, instant, counter = w.begin, w.end, w.instant, w.counter
    gc.collect()
    tracemalloc.start()
    samples = [(0, rss_bytes(), tracemalloc.get_traced_memory()[0])]
    written = 0
    base = t0
    task_base = 0
    while written < total:
        for kind, i, n, ts, x in chunk.events:
            if kind == BEGIN:
                if x is None:
                    begin(tracks[i], names[n], base + ts)
                else:
                    task_id = task_base + x["task_id"]  # fresh ids in every chunk
                    object_id = f"{task_id * 0x9E3779B97F4A7C15:x}"[-16:]
                    x = dict(x, task_id=task_id, object_id=object_id)
                    begin(tracks[i], names[n], base + ts, args=x)
            elif kind == END:
                end(tracks[i], base + ts)
            elif kind == COUNTER:
                counter(counters[i], x, base + ts)
            else:
                instant(tracks[i], inames[n], base + ts)
        written += len(chunk.events)
        base += span
        task_base += 1_000_000
        samples.append((written, rss_bytes(), tracemalloc.get_traced_memory()[0]))
        print(f"  {written:>11,} events  rss {samples[-1][1] / 2**20:8.1f} MiB  "
              f"traced {samples[-1][2] / 2**20:8.2f} MiB", flush=True)
    tracemalloc.stop()
    w.close()
    size = path.stat().st_size
    path.unlink()
    return samples, size


# ------------------------------------------------------------------ report


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = []
    for k, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


Row = tuple[str, str, str, bool | None]  # target, goal, measured, passed (None: info)


def speed_and_size(events: int, repeats: int, workdir: Path) -> list[Row]:
    """Write the plain and mixed streams with every writer; the summary rows."""
    plain = make_stream(events, with_args=False)
    mixed = make_stream(events, with_args=True)
    per_variant: dict[str, dict[str, Result]] = {}
    for label, stream in (("plain", plain), ("mixed", mixed)):
        n = len(stream.events)
        print(f"\n[{label}] {n:,} events: {stream.count(BEGIN):,} begin, "
              f"{stream.count(END):,} end, {stream.count(INSTANT):,} instant, "
              f"{stream.count(COUNTER):,} counter; "
              f"{sum(1 for e in stream.events if e[0] == BEGIN and e[4]):,} with args; "
              f"{repeats} runs each")
        res = measure(stream, repeats, workdir)
        per_variant[label] = res
        ours = res["tracer"]
        rows = [["writer", "us/event (median)", "min", "max", "wall us/event",
                 "bytes/event", "ours faster by", "ours smaller by"]]
        for name, r in res.items():
            if name == "loop overhead":
                continue
            rows.append([
                name,
                f"{r.us_per_event:.3f}",
                f"{min(r.times) / n * 1e6:.3f}",
                f"{max(r.times) / n * 1e6:.3f}",
                f"{r.wall_us_per_event:.3f}",
                f"{r.bytes_per_event:.2f}",
                f"{r.us_per_event / ours.us_per_event:.2f}x",
                f"{r.bytes_per_event / ours.bytes_per_event:.2f}x",
            ])
        lo = res["loop overhead"]
        rows.append(["loop overhead", f"{lo.us_per_event:.3f}", "", "",
                     f"{lo.wall_us_per_event:.3f}", "", "", ""])
        print(table(rows))

    slices = Stream(plain.t0, [e for e in plain.events if e[0] != COUNTER])
    slice_bpe = size_only(slices, workdir) / len(slices.events)
    print(f"\nargs-free slice events only (begin/end/instant, {len(slices.events):,}): "
          f"{slice_bpe:.2f} bytes/event")

    p, m = per_variant["plain"], per_variant["mixed"]
    p_ours, m_ours = p["tracer"], m["tracer"]
    speed_json = p["json"].us_per_event / p_ours.us_per_event
    speed_pb2 = p["perfetto-pb2"].us_per_event / p_ours.us_per_event
    size_json = m["json"].size / m_ours.size
    size_zlib = m["json"].size / m["tracer+zlib"].size
    size_json_us = m["json"].size / m["tracer us"].size
    size_zlib_us = m["json"].size / m["tracer us+zlib"].size
    return [
        ("plain events: us/event (median)", "<= 0.5",
         f"{p_ours.us_per_event:.3f}", p_ours.us_per_event <= 0.5),
        ("plain events: faster than JSON", ">= 4x", f"{speed_json:.2f}x", speed_json >= 4),
        ("plain events: faster than TraceProtoBuilder", ">= 2.5x",
         f"{speed_pb2:.2f}x", speed_pb2 >= 2.5),
        ("args-free slice events: bytes/event", "<= 16", f"{slice_bpe:.2f}", slice_bpe <= 16),
        ("mixed stream: smaller than JSON (ns)", ">= 6x", f"{size_json:.2f}x", size_json >= 6),
        ("mixed stream: smaller than JSON (us)", ">= 6x",
         f"{size_json_us:.2f}x", size_json_us >= 6),
        ("mixed stream, compress=True: smaller than JSON (ns)", ">= 15x",
         f"{size_zlib:.2f}x", size_zlib >= 15),
        ("mixed stream, compress=True: smaller than JSON (us)", ">= 15x",
         f"{size_zlib_us:.2f}x", size_zlib_us >= 15),
        ("(info) mixed: us/event, ours / pb2 / json", "",
         f"{m_ours.us_per_event:.3f} / {m['perfetto-pb2'].us_per_event:.3f} / "
         f"{m['json'].us_per_event:.3f}", None),
        ("(info) mixed compress=True: us/event, bytes/event", "",
         f"{m['tracer+zlib'].us_per_event:.3f}, {m['tracer+zlib'].bytes_per_event:.2f}", None),
        ("(info) mixed: smaller than TraceProtoBuilder", "",
         f"{m['perfetto-pb2'].size / m_ours.size:.2f}x", None),
    ]


def memory(events: int, step: int, workdir: Path) -> list[Row]:
    print(f"\n[memory] {events:,} mixed events through one TraceWriter "
          "(tracemalloc on, so slower)")
    samples, size = memory_check(events, step, workdir)
    # Judged after the first step, which includes one-time warm-up (caches,
    # interning tables, the buffer reaching its size). The traced memory moves
    # by ~1 MiB as the writer's bounded "strings seen once" set fills and is
    # emptied; a writer that kept even 1 byte per event would grow RSS by
    # ~9 MiB over 9M events.
    after = samples[1:]
    rss_growth = samples[-1][1] - samples[1][1]
    traced_max = max(traced for _, _, traced in after)
    traced_min = min(traced for _, _, traced in after)
    print(f"  file {size / 2**20:.1f} MiB ({size / samples[-1][0]:.2f} bytes/event); "
          f"from {samples[1][0]:,} to {samples[-1][0]:,} events: "
          f"rss {rss_growth / 2**20:+.2f} MiB, traced between "
          f"{traced_min / 2**20:.2f} and {traced_max / 2**20:.2f} MiB")
    return [(
        f"writer memory flat over {samples[-1][0]:,} events",
        "rss growth <= 4 MiB, traced <= 4 MiB",
        f"rss {rss_growth / 2**20:+.2f} MiB, traced "
        f"{traced_min / 2**20:.2f}-{traced_max / 2**20:.2f} MiB",
        rss_growth <= 4 << 20 and traced_max <= 4 << 20,
    )]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Benchmark tracer's TraceWriter against TraceProtoBuilder and Chrome JSON."
    )
    parser.add_argument("--events", type=int, default=200_000, help="events per stream")
    parser.add_argument("--repeats", type=int, default=7, help="runs per writer (median)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--memory", action="store_true",
                      help="only the memory check: --memory-events through one writer")
    mode.add_argument("--all", action="store_true", help="speed and size, then the memory check")
    parser.add_argument("--memory-events", type=int, default=10_000_000)
    parser.add_argument("--memory-step", type=int, default=1_000_000,
                        help="sample memory every this many events")
    args = parser.parse_args(argv)

    from google.protobuf.internal import api_implementation

    print(f"python {sys.version.split()[0]}, protobuf backend {api_implementation.Type()}, "
          f"{os.cpu_count()} cpus")
    summary: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench_format_") as tmp:
        workdir = Path(tmp)
        if not args.memory:
            summary += speed_and_size(args.events, args.repeats, workdir)
        if args.memory or args.all:
            summary += memory(args.memory_events, args.memory_step, workdir)
        else:
            summary.append(("writer memory flat over 10M events", "",
                            "not run (--memory or --all)", None))

    rows = [["target", "goal", "measured", "result"]]
    rows += [[name, goal, got, "" if ok is None else verdict(ok)]
             for name, goal, got, ok in summary]
    print("\nSUMMARY\n" + table(rows))
    return 0 if all(ok is not False for *_, ok in summary) else 1


if __name__ == "__main__":
    sys.exit(main())

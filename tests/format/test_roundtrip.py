"""Random event sequences round-trip through TraceWriter and read_trace unchanged.

A script is generated in time order (strictly increasing timestamps, slices
properly nested per track, flows that start, step and end), then some leaf
slices, instants and counter samples are moved later in the file, so that the
writer must write them as late events (absolute BOOTTIME timestamps). The
expected model is computed from the time-ordered script alone, independently
of the reader.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from trace_helpers import FakeClock

from tracer.format import CounterTrack, TraceModel, TraceWriter, Track, TrackInfo, read_trace
from tracer.format.model import CounterSample

START = 1_000_000_000
INT64_MIN = -(1 << 63)
UINT64_MAX = (1 << 64) - 1

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)
NAMES = st.sampled_from(["task", "stage", "wave"]) | TEXT
CATEGORIES = st.none() | st.sampled_from(["scheduler", "task"]) | TEXT
# Keys of BEGIN and END args never clash (END args are merged into the slice's).
BEGIN_KEYS = st.text(alphabet="abcé.[]", min_size=1, max_size=4)
END_KEYS = st.text(alphabet="xyzß", min_size=1, max_size=4)
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.integers(min_value=-5, max_value=5)
    | st.floats(allow_nan=False)
    | TEXT
    | st.sampled_from(["repeated-a", "repeated-b", "x" * 300])
)
VALUES = st.recursive(
    LEAVES,
    lambda children: st.lists(children, min_size=1, max_size=3)
    | st.tuples(children, children)
    | st.dictionaries(TEXT, children, min_size=1, max_size=3),
    max_leaves=6,
)
GAPS = st.sampled_from([1, 2, 127, 128, 16383, 16384, 2_097_152, 10**9]) | st.integers(1, 10**6)


def _label(script: Script, model: TraceModel) -> None:
    """Coverage labels (pytest --hypothesis-show-statistics)."""
    late = sum(1 for a, b in zip(script.ops, script.file_order, strict=True) if a is not b)
    event(f"late events: {'yes' if late else 'no'}")
    event(f"flows: {'yes' if model.flows else 'no'}")
    steps = len({f.flow_id for f in model.flows}) < len(model.flows)
    event(f"flow steps: {'yes' if steps else 'no'}")
    event(f"counters: {'yes' if model.counters else 'no'}")
    event(f"open slices: {'yes' if any(s.dur is None for s in model.slices) else 'no'}")
    event(f"nested slices: {'yes' if any(s.depth for s in model.slices) else 'no'}")
    event(f"mid-trace tracks: {'yes' if any(o.kind == 'declare' for o in script.ops) else 'no'}")


def expected_value(value: Any) -> Any:
    """What the writer makes of an annotation value, as the reader returns it."""
    if value is True or value is False:
        return value
    if isinstance(value, int):
        return value if INT64_MIN <= value <= UINT64_MAX else str(value)
    if isinstance(value, (float, str)):
        return value
    if isinstance(value, dict):
        return {k: expected_value(v) for k, v in value.items()} if value else None
    if isinstance(value, (list, tuple)):
        return [expected_value(v) for v in value] if value else None
    return str(value)


@dataclass
class TrackSpec:
    index: int
    kind: str  # process | thread | track | counter
    name: str
    parent: int | None = None
    pid: int | None = None
    tid: int | None = None
    rank: int | None = None
    child_ordering: str | None = None
    merge: bool = True
    description: str | None = None
    unit: str | None = None
    unit_name: str | None = None
    unit_multiplier: int = 1
    dedupe: bool = True


@dataclass
class Op:
    kind: str  # declare | begin | end | instant | counter
    ts: int
    track: int
    name: str | None = None
    category: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    flows: list[int] = field(default_factory=list)
    terminating: list[int] = field(default_factory=list)
    value: int | float = 0
    slice_key: int | None = None  # an END: the begin ts of the slice it closes


@dataclass
class Script:
    tracks: list[TrackSpec]
    ops: list[Op]  # in time order
    file_order: list[Op]


def draw_script(draw: Any) -> Script:
    tracks: list[TrackSpec] = []
    pids: list[int] = []
    for _ in range(draw(st.integers(0, 2))):
        pid = draw(st.integers(1, (1 << 31) - 1).filter(lambda p: p not in pids))
        pids.append(pid)
        tracks.append(TrackSpec(len(tracks), "process", draw(TEXT), pid=pid,
                                rank=draw(st.none() | st.integers(0, 100))))
    tids: set[tuple[int, int]] = set()
    for _ in range(draw(st.integers(0, 2))):
        pid = draw(st.sampled_from(pids) if pids else st.integers(1, 1000))
        tid = draw(st.integers(1, (1 << 32) - 1).filter(lambda t, pid=pid: (pid, t) not in tids))
        tids.add((pid, tid))
        tracks.append(TrackSpec(len(tracks), "thread", draw(TEXT), pid=pid, tid=tid,
                                rank=draw(st.none() | st.integers(0, 100))))

    def plain_track() -> TrackSpec:
        parents = [t.index for t in tracks if t.kind != "counter"]
        return TrackSpec(
            len(tracks), "track", draw(st.sampled_from(["task", "lane"]) | TEXT),
            parent=draw(st.none() | st.sampled_from(parents)) if parents else None,
            rank=draw(st.none() | st.integers(0, 1000)),
            child_ordering=draw(st.sampled_from([None, "lexicographic", "chronological",
                                                 "explicit"])),
            merge=draw(st.booleans()),
            description=draw(st.none() | TEXT),
        )

    for _ in range(draw(st.integers(1, 3))):
        tracks.append(plain_track())
    for _ in range(draw(st.sampled_from([0, 1, 1, 2]))):
        unit = draw(st.sampled_from(["count", "bytes", "ns", None]))
        parents = [t.index for t in tracks if t.kind != "counter"]
        tracks.append(TrackSpec(
            len(tracks), "counter", draw(TEXT),
            parent=draw(st.none() | st.sampled_from(parents)),
            rank=draw(st.none() | st.integers(0, 10)),
            unit=unit,
            unit_name="rows/s" if unit is None else None,
            unit_multiplier=draw(st.sampled_from([1, 3, 1024])),
            dedupe=draw(st.booleans()),
            description=draw(st.none() | TEXT),
        ))

    ops: list[Op] = []
    now = START
    stacks: dict[int, list[int]] = {}  # track -> begin ts of its open slices
    open_flows: set[int] = set()
    used_flows: set[int] = set()
    declared = {t.index for t in tracks}

    def new_flow() -> int:
        flow = draw(st.integers(1, UINT64_MAX).filter(lambda f: f not in used_flows))
        used_flows.add(flow)
        open_flows.add(flow)
        return flow

    def outgoing() -> list[int]:
        choice = draw(st.sampled_from(["none", "none", "new", "step"]))
        if choice == "new":
            return [new_flow()]
        if choice == "step" and open_flows:
            return [draw(st.sampled_from(sorted(open_flows)))]
        return []

    def incoming(exclude: list[int]) -> list[int]:
        candidates = sorted(open_flows - set(exclude))
        if candidates and draw(st.booleans()):
            flow = draw(st.sampled_from(candidates))
            open_flows.discard(flow)
            return [flow]
        return []

    for _ in range(draw(st.integers(0, 30))):
        now += draw(GAPS)
        slice_tracks = [t.index for t in tracks if t.kind != "counter" and t.index in declared]
        counters = [t.index for t in tracks if t.kind == "counter"]
        open_tracks = [i for i, s in stacks.items() if s]
        kinds = ["begin", "begin", "instant", "declare"]
        kinds += ["end", "end", "end"] if open_tracks else []
        kinds += ["counter", "counter"] if counters else []
        kind = draw(st.sampled_from(kinds))
        if kind == "declare":
            spec = plain_track()
            tracks.append(spec)
            declared.add(spec.index)
            ops.append(Op("declare", now, spec.index))
        elif kind == "begin":
            track = draw(st.sampled_from(slice_tracks))
            out = outgoing()
            ops.append(Op("begin", now, track, draw(NAMES), draw(CATEGORIES),
                          draw(st.dictionaries(BEGIN_KEYS, VALUES, max_size=3)),
                          out, incoming(out)))
            stacks.setdefault(track, []).append(now)
        elif kind == "instant":
            track = draw(st.sampled_from(slice_tracks))
            out = outgoing()
            ops.append(Op("instant", now, track, draw(NAMES), draw(CATEGORIES),
                          draw(st.dictionaries(BEGIN_KEYS, VALUES, max_size=2)),
                          out, incoming(out)))
        elif kind == "end":
            track = draw(st.sampled_from(open_tracks))
            ops.append(Op("end", now, track, args=draw(st.dictionaries(END_KEYS, VALUES,
                                                                        max_size=2)),
                          flows=outgoing(), slice_key=stacks[track].pop()))
        else:
            track = draw(st.sampled_from(counters))
            value = draw(st.integers(-(1 << 40), 1 << 40) | st.floats(-1e12, 1e12)
                         | st.sampled_from([0, 1, 1.0]))
            ops.append(Op("counter", now, track, value=value))

    # Move some leaf slices, instants and counter samples later in the file.
    movable: list[list[Op]] = []
    for i, op in enumerate(ops):
        if op.kind in ("instant", "counter"):
            movable.append([op])
        elif op.kind == "begin":
            for later in ops[i + 1:]:
                if later.track == op.track:
                    if later.kind == "end" and later.slice_key == op.ts:
                        movable.append([op, later])
                    break
    file_order = list(ops)
    for group in movable:
        if draw(st.integers(0, 3)) != 0:
            continue
        last = max(file_order.index(o) for o in group)
        if last == len(file_order) - 1:
            continue
        for o in group:
            file_order.remove(o)
        at = draw(st.integers(last - len(group) + 1, len(file_order)))
        file_order[at:at] = group
    return Script(tracks, ops, file_order)


def write(script: Script, path: Path, options: dict[str, Any]) -> dict[int, Track]:
    """Replay the script in file order; returns the writer's track per script track."""
    handles: dict[int, Track] = {}
    declared_late = {op.track for op in script.ops if op.kind == "declare"}

    def declare(w: TraceWriter, spec: TrackSpec) -> None:
        parent = handles[spec.parent] if spec.parent is not None else None
        if spec.kind == "process":
            handles[spec.index] = w.process_track(spec.pid, spec.name, rank=spec.rank)
        elif spec.kind == "thread":
            handles[spec.index] = w.thread_track(spec.pid, spec.tid, spec.name, rank=spec.rank)
        elif spec.kind == "track":
            handles[spec.index] = w.track(
                spec.name, parent=parent, rank=spec.rank, child_ordering=spec.child_ordering,
                merge=spec.merge, description=spec.description,
            )
        else:
            handles[spec.index] = w.counter_track(
                spec.name, parent=parent, unit=spec.unit, unit_name=spec.unit_name,
                unit_multiplier=spec.unit_multiplier, rank=spec.rank,
                description=spec.description, dedupe=spec.dedupe,
            )

    with TraceWriter(path, clock=FakeClock(START), **options) as w:
        for spec in script.tracks:
            if spec.index not in declared_late:
                declare(w, spec)
        i = 0
        order = script.file_order
        while i < len(order):
            op = order[i]
            track = handles.get(op.track)
            if op.kind == "declare":
                declare(w, script.tracks[op.track])
            elif op.kind == "begin":
                after = order[i + 1] if i + 1 < len(order) else None
                if (after is not None and after.kind == "end" and after.slice_key == op.ts
                        and not after.args and not after.flows):
                    w.complete(track, op.name, op.ts, after.ts, category=op.category,
                               args=op.args, flows=op.flows, terminating_flows=op.terminating)
                    i += 1
                else:
                    w.begin(track, op.name, op.ts, category=op.category, args=op.args,
                            flows=op.flows, terminating_flows=op.terminating)
            elif op.kind == "end":
                w.end(track, op.ts, args=op.args, flows=op.flows)
            elif op.kind == "instant":
                w.instant(track, op.name, op.ts, category=op.category, args=op.args,
                          flows=op.flows, terminating_flows=op.terminating)
            else:
                assert isinstance(track, CounterTrack)
                w.counter(track, op.value, op.ts)
            i += 1
    return handles


def expected_tracks(script: Script, handles: dict[int, Track]) -> dict[int, TrackInfo]:
    out = {}
    for spec in script.tracks:
        uuid = handles[spec.index].uuid
        parent = handles[spec.parent].uuid if spec.parent is not None else None
        if spec.kind == "process":
            info = TrackInfo(uuid, spec.name, "process", pid=spec.pid,
                             sibling_order_rank=spec.rank)
        elif spec.kind == "thread":
            info = TrackInfo(uuid, spec.name, "thread", pid=spec.pid, tid=spec.tid,
                             sibling_order_rank=spec.rank)
        elif spec.kind == "track":
            info = TrackInfo(uuid, spec.name, "track", parent_uuid=parent,
                             sibling_order_rank=spec.rank, child_ordering=spec.child_ordering,
                             sibling_merge_behavior=None if spec.merge else "none",
                             description=spec.description or None)
        else:
            info = TrackInfo(uuid, spec.name, "counter", parent_uuid=parent,
                             unit=spec.unit or spec.unit_name,
                             unit_multiplier=spec.unit_multiplier, sibling_order_rank=spec.rank,
                             description=spec.description or None)
        out[uuid] = info
    return out


def expected_events(script: Script, handles: dict[int, Track]) -> dict[str, Any]:
    """Slices, instants, flows and open-slice count, simulated in time order."""
    uuid = {i: h.uuid for i, h in handles.items()}
    stacks: dict[int, list[int]] = {}
    slices: dict[int, dict[str, Any]] = {}
    instants = []
    touches: dict[int, list[tuple[str, int]]] = {}  # flow -> [(out|in, slice key)]
    for op in script.ops:
        if op.kind == "begin":
            stack = stacks.setdefault(op.track, [])
            slices[op.ts] = {
                "track": uuid[op.track], "name": op.name, "category": op.category,
                "ts": op.ts, "dur": None, "depth": len(stack),
                "parent": stack[-1] if stack else None, "args": dict(op.args),
            }
            stack.append(op.ts)
            key = op.ts
        elif op.kind == "end":
            key = stacks[op.track].pop()
            assert key == op.slice_key
            slices[key]["dur"] = op.ts - key
            slices[key]["args"].update(op.args)
        elif op.kind == "instant":
            stack = stacks.get(op.track, [])
            instants.append((op.ts, uuid[op.track], op.name, op.category, len(stack),
                             stack[-1] if stack else None, expected_value(op.args) or {}))
            key = op.ts
        else:
            continue
        for flow in op.flows:
            touches.setdefault(flow, []).append(("out", key))
        for flow in op.terminating:
            touches.setdefault(flow, []).append(("in", key))
    flows = []
    for flow, steps in touches.items():
        previous = None
        for direction, key in steps:
            if previous is not None:
                flows.append((flow, previous, key))
            previous = key if direction == "out" else None
    slice_rows = sorted(
        (s["ts"], s["track"], s["name"], s["category"], s["dur"], s["depth"], s["parent"],
         expected_value(s["args"]) or {})
        for s in slices.values()
    )
    return {
        "slices": slice_rows,
        "instants": sorted(instants, key=lambda row: row[0]),
        "flows": sorted(flows),
        "open": sum(1 for s in slices.values() if s["dur"] is None),
    }


def expected_counters(script: Script, handles: dict[int, Track]) -> list[tuple[int, int, Any]]:
    """Samples the writer keeps (dedupe is in file order), multiplied, by timestamp."""
    last: dict[int, Any] = {}
    kept = []
    for op in script.file_order:
        if op.kind != "counter":
            continue
        spec = script.tracks[op.track]
        if spec.dedupe and op.track in last and last[op.track] == op.value:
            continue
        last[op.track] = op.value
        kept.append((op.ts, handles[op.track].uuid, op.value * spec.unit_multiplier))
    return sorted(kept, key=lambda row: row[0])


def observed(model: TraceModel) -> dict[str, Any]:
    ts_of = {s.id: s.ts for s in model.slices} | {i.id: i.ts for i in model.instants}
    return {
        "slices": [
            (s.ts, s.track_uuid, s.name, s.category, s.dur, s.depth,
             ts_of[s.parent_id] if s.parent_id is not None else None, s.args)
            for s in model.slices
        ],
        "instants": [
            (i.ts, i.track_uuid, i.name, i.category, i.depth,
             ts_of[i.parent_id] if i.parent_id is not None else None, i.args)
            for i in model.instants
        ],
        "flows": sorted((f.flow_id, ts_of[f.source_id], ts_of[f.dest_id]) for f in model.flows),
        "open": sum(1 for s in model.slices if s.dur is None),
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_traces_round_trip(data: st.DataObject) -> None:
    script = draw_script(data.draw)
    options = {
        "compress": data.draw(st.booleans(), label="compress"),
        "buffer_size": data.draw(st.sampled_from([1024, 1500, 4096, 256 * 1024]), label="buffer"),
        "intern_limit": data.draw(st.sampled_from([1, 3, 65536]), label="intern_limit"),
        "sequence_id": data.draw(st.sampled_from([1, 9, (1 << 32) - 1]), label="sequence_id"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.perfetto-trace"
        handles = write(script, path, options)
        model = read_trace(path)
    _label(script, model)
    assert not model.truncated
    assert model.tracks == expected_tracks(script, handles)
    ranked = any(t.rank is not None for t in script.tracks if t.kind in ("process", "thread"))
    assert model.process_ordering == ("explicit" if ranked else None)
    expected = expected_events(script, handles)
    assert observed(model) == expected
    counters = [(c.ts, c.track_uuid, c.value) for c in model.counters]
    assert counters == expected_counters(script, handles)
    for (_, _, got), (_, _, want) in zip(counters, expected_counters(script, handles),
                                         strict=True):
        assert type(got) is type(want)
    assert Counter(p.kind for p in model.problems) == (
        Counter({"unterminated_slice": expected["open"]}) if expected["open"] else Counter()
    )
    # Strict mode accepts the trace exactly when no slice is left open.
    if not expected["open"]:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "t.perfetto-trace"
            write(script, path, options)
            read_trace(path, strict=True)


def test_empty_containers_read_back_as_none(tmp_path: Path) -> None:
    """The writer encodes {} and [] as an annotation with no value at all."""
    path = tmp_path / "t.perfetto-trace"
    with TraceWriter(path, clock=FakeClock(START)) as w:
        t = w.track("lane")
        w.instant(t, "e", START + 1, args={"d": {}, "l": [], "nested": {"x": [], "y": [{}]}})
    (instant,) = read_trace(path, strict=True).instants
    assert instant.args == {"d": None, "l": None, "nested": {"x": None, "y": [None]}}


def test_value_types_read_back_exactly(tmp_path: Path) -> None:
    path = tmp_path / "t.perfetto-trace"
    args = {"i": 3, "u": UINT64_MAX, "f": 3.0, "b": True, "s": "3", "neg": -(1 << 63)}
    with TraceWriter(path, clock=FakeClock(START)) as w:
        t = w.track("lane")
        w.instant(t, "e", START + 1, args=args)
    (instant,) = read_trace(path).instants
    assert instant.args == args
    assert [type(v) for v in instant.args.values()] == [int, int, float, bool, str, int]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_counter_sequences_round_trip(data: st.DataObject) -> None:
    """Samples of a CounterSequence (own packet sequence, extra counter values from the
    sequence's defaults, incremental clock in ``time_unit_ns``) read back as written:
    per-track dedupe, in-order timestamps rounded down to the unit, late ones exact."""
    draw = data.draw
    n_tracks = draw(st.integers(1, 9))
    multipliers = [draw(st.sampled_from([1, 1024])) for _ in range(n_tracks)]
    unit = draw(st.sampled_from([1, 1000, 1_000_000]))
    samples = []
    now = START + draw(st.integers(0, 10**6))
    for _ in range(draw(st.integers(1, 25))):
        if draw(st.integers(0, 4)) == 0:
            ts = draw(st.integers(START, now))  # late (or not, if equal)
        else:
            now += draw(GAPS)
            ts = now
        values = [draw(st.none() | st.integers(-(1 << 40), 1 << 40) | st.sampled_from([0, 1]))
                  for _ in range(n_tracks)]
        samples.append((ts, values))
    also_main = draw(st.booleans())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.perfetto-trace"
        with TraceWriter(path, clock=FakeClock(START), compress=draw(st.booleans()),
                         buffer_size=1024) as w:
            tracks = [w.counter_track(f"c{i}", unit_multiplier=m)
                      for i, m in enumerate(multipliers)]
            lane = w.track("lane")
            sequence = w.counter_sequence(tracks, time_unit_ns=unit)
            for ts, values in samples:
                sequence.sample(ts, *values)
                if also_main:  # the writer's own sequence keeps going in between
                    w.instant(lane, "tick", max(ts, w.start_ts))
        model = read_trace(path, strict=True)

    expected = []
    last: list[int | None] = [None] * n_tracks
    last_units = None
    for ts, values in samples:
        changed = [(i, v) for i, v in enumerate(values) if v is not None and v != last[i]]
        if not changed:
            continue
        if last_units is None:
            last_units = ts // unit
        units = ts // unit
        if units >= last_units:
            read_ts = units * unit
            last_units = units
        else:
            read_ts = ts
        for i, v in changed:
            last[i] = v
            expected.append(CounterSample(tracks[i].uuid, read_ts, v * multipliers[i]))
    expected.sort(key=lambda c: c.ts)
    assert model.counters == expected
    assert sequence.samples_written == len(expected)
    assert len(model.instants) == (len(samples) if also_main else 0)

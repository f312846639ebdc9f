"""``tracer convert TIMELINE.json``: Ray's timeline (Chrome JSON) as a native Perfetto trace.

``ray timeline`` and ``ray.timeline()`` write every task's profile events as
Chrome JSON: one complete event (``"ph": "X"``) per phase, ``pid`` the node
(its IP, or an index named by a ``process_name`` metadata event in the
dashboard's version), ``tid`` the worker (``worker:<id>``, or an index named
by ``thread_name``). The UI struggles with such files past a few thousand
tasks (ray#32031). The conversion writes the same events as tracer's
compressed protobuf: a process per node, a thread per worker (and per
driver), each task's ``ray task <name>`` slice with Ray's phases nested in
it (``deserialize arguments``, ``execute``, ``store outputs``) and its task
id and name as annotations; other events (``submit_task`` on the driver,
...) under their own names.

It streams: the file is read twice (names first, then events), one event at
a time (:mod:`tracer.cli.chrome_json`), so memory holds a chunk, the names of
nodes and workers, and the few events of one task at a time. A gzip-compressed
timeline (``timeline.json.gz``; told by its first bytes, not its name) is
inflated as it is read, a chunk at a time.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import gzip
import os
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tracer.cli._common import warn
from tracer.cli.chrome_json import ChromeJsonError, iter_events
from tracer.format import TraceWriter, Track
from tracer.ray import layout as L

HELP = "convert Ray's timeline (ray timeline / ray.timeline() Chrome JSON) to a Perfetto trace"

#: Ray's profile events of a task's phases, and their names in tracer's traces.
_PHASES = {
    "task:deserialize_arguments": L.PHASE_DESERIALIZE,
    "task:execute": L.PHASE_EXECUTE,
    "task:store_outputs": L.PHASE_STORE_OUTPUTS,
}
#: Annotations kept from an event's args (Ray's; the rest is colour and repetition).
_ARGS = ("task_id", "job_id", "attempt_number", "func_or_class_name", "actor_id", "name")
#: Events of a worker held until its task's own slice arrives (Ray lists a task's
#: phases before it); past this many, written as they are.
_MAX_PENDING = 64
#: Spans a lane remembers (see _Lane): bounded memory for any size of file.
_MAX_SPANS = 1024
_PID_BASE = 1_000_000
_TID_BASE = 2_000_000  # tids are unique across processes: trace_processor keys threads by tid


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "convert",
        help=HELP,
        description=(
            "Convert a Ray timeline, the Chrome JSON that `ray timeline` or ray.timeline() "
            "writes, to a native Perfetto trace: a process per node, a thread per worker, "
            "each task with Ray's phases nested in it and its task id as an annotation. "
            "Reads it plain or gzip-compressed. Streams, so any size converts in bounded "
            "memory."
        ),
    )
    parser.add_argument(
        "json", metavar="TIMELINE", help="the Chrome JSON file (or that file gzip-compressed)"
    )
    parser.add_argument(
        "-o", "--output", metavar="TRACE",
        help="the trace to write, or a folder to write it in (default: TIMELINE with "
        ".perfetto-trace for .json or .json.gz)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    source = Path(args.json)
    # The input first: a wrong input is the mistake to report, whatever -o says.
    if not source.exists():
        raise ChromeJsonError(f"no such trace file: {source}")
    if source.is_dir():
        raise ChromeJsonError(f"{source}: is a folder, not a JSON file")
    check_input(source)
    default = default_output(source)
    if args.output is None:
        out = default
    elif Path(args.output).is_dir():
        out = Path(args.output) / default.name  # -o FOLDER: the default name, in it
    elif args.output.endswith(("/", os.sep)):
        raise ChromeJsonError(f"{args.output}: no such folder")
    else:
        out = Path(args.output)
    if out.resolve() == source.resolve() or _same_file(out, source):
        raise ChromeJsonError(f"{out}: the output would overwrite the input; give -o TRACE")
    stats = convert(source, out)
    if not stats.skipped and not stats.slices:
        # No event at all ([] or {"traceEvents": []}): an empty trace would read as a run
        # with no tasks, where Ray recorded none (it had run none, or its task events off).
        with contextlib.suppress(OSError):
            out.unlink()
        raise ChromeJsonError(
            f"{source}: holds no events: Ray's timeline of a cluster that ran no task "
            "(or with its task events off: RAY_task_events_report_interval_ms=0); "
            "nothing to convert"
        )
    if stats.skipped and not stats.slices:
        # Nothing it could place: not Ray's timeline. An empty trace and status 0 would
        # say the run had no tasks.
        with contextlib.suppress(OSError):
            out.unlink()
        why = f"{source}: none of its {stats.skipped} event(s) is a complete ('X') event " \
              "with a time, which Ray's timeline (`ray timeline`, ray.timeline()) is made of"
        if stats.begin_end:
            why += (f"; {stats.begin_end} are begin/end ('B'/'E') events, as Daft's own "
                    "tracer writes (logs/daft/*.json): to trace Daft with tracer, call "
                    "tracer.integrations.daft.install() before the query (README: Daft)")
        raise ChromeJsonError(why)
    if stats.skipped:
        warn(f"{stats.skipped} event(s) skipped: not complete ('X') events with a time")
    print(f"{out}: {stats.tasks} task(s), {stats.slices} slice(s) on {stats.workers} "
          f"thread(s) of {stats.nodes} node(s)", file=sys.stdout)
    return 0


def default_output(source: Path) -> Path:
    """``x.json`` and ``x.json.gz`` as ``x.perfetto-trace``, beside them."""
    name = source.name
    if name.lower().endswith(".gz") and len(name) > 3:
        source = source.with_name(name[:-3])
    return source.with_suffix(".perfetto-trace")


_GZIP_MAGIC = b"\x1f\x8b"
_SNIFF = 4096


def _is_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == _GZIP_MAGIC


def check_input(source: Path) -> None:
    """Refuse, saying why, an input that is no Chrome JSON in a way worth naming: an empty
    file, or a Perfetto protobuf trace already (plain or gzip-compressed). Other inputs
    are left to the parser, which says where they go wrong."""
    gz = _is_gzip(source)
    with source.open("rb") as f:
        if gz:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            try:
                head = inflater.decompress(f.read(1 << 16), _SNIFF)
            except zlib.error as exc:
                raise ChromeJsonError(
                    f"{source}: its gzip compression is damaged ({exc})"
                ) from None
        else:
            head = f.read(_SNIFF)
    packed = " (gzip-compressed)" if gz else ""
    if not head:
        raise ChromeJsonError(
            f"{source}: the file is empty{' once inflated' if gz else ''}: there are no "
            "events to convert"
        )
    # A Perfetto trace starts with a TracePacket record's tag (0a, a newline to JSON):
    # the format layer's walk of the records tells (JSON fails it at its first bytes).
    if head[0] == 0x0A and _is_perfetto_trace(source):
        raise ChromeJsonError(
            f"{source}: it already is a Perfetto protobuf trace{packed}, not Chrome JSON: "
            "there is nothing to convert (tracer summary, tracer open and the Perfetto UI "
            "read it as it is)"
        )


def _is_perfetto_trace(path: Path) -> bool:
    from tracer.errors import TraceReadError
    from tracer.format import check_framing

    try:
        framing = check_framing(path)
    except TraceReadError:
        return False
    # Every record sound (a trace cut short is still one): a JSON text that starts with
    # a newline reads as a record or two, then as damage.
    return framing.records > 0 and framing.damaged_at is None


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file (a hard link to it included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False  # one of them does not exist (yet)


class Stats:
    """What a conversion wrote."""

    def __init__(self) -> None:
        self.tasks = 0
        self.slices = 0
        self.skipped = 0
        self.begin_end = 0  # of the skipped: 'B' and 'E' events (not Ray's: Daft's own)
        self.nodes = 0
        self.workers = 0


def _open_text(path: Path) -> IO[str]:
    """The file as text, inflated as it is read when it is gzip-compressed."""
    if _is_gzip(path):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return path.open(encoding="utf-8", errors="replace")


def _events(path: Path) -> Iterator[dict[str, Any]]:
    with _open_text(path) as f:
        try:
            yield from iter_events(f, str(path))
        except EOFError:  # gzip's: the compressed stream stops inside a member
            raise ChromeJsonError(
                f"{path}: the gzip file is cut short (while being written or copied?)"
            ) from None
        except (zlib.error, gzip.BadGzipFile) as exc:
            raise ChromeJsonError(f"{path}: its gzip compression is damaged ({exc})") from None


def convert(source: Path, out: Path) -> Stats:
    """Convert ``source`` (Chrome JSON) into ``out``; raises ChromeJsonError on bad input."""
    names: dict[tuple[str, str | None], str] = {}
    for ev in _events(source):  # first pass: the names of processes and threads
        if ev.get("ph") == "M" and isinstance(ev.get("args"), dict):
            label = ev["args"].get("name")
            if ev.get("name") == "process_name" and label:
                names[(str(ev.get("pid")), None)] = str(label)
            elif ev.get("name") == "thread_name" and label:
                names[(str(ev.get("pid")), str(ev.get("tid")))] = str(label)
    stats = Stats()
    with TraceWriter(out, compress=True) as w:
        conv = _Converter(w, names, stats)
        for ev in _events(source):
            conv.add(ev)
        conv.flush_all()
    return stats


class _Lane:
    """A track and the time it holds: disjoint spans, sorted, at most ``_MAX_SPANS``.

    Ray's file lists a worker's tasks mostly in order, newest or oldest
    first, with some out of place: a task that fits a gap between those
    written goes in it (a lane that only took tasks before or after all it
    held put 35 of a sequential worker's 978 tasks on a second lane, as if it
    ran two at once). Bounded: past the cap, the two spans closest together
    are merged (what falls in that gap later takes another lane).
    """

    __slots__ = ("spans", "track")

    def __init__(self, track: Track) -> None:
        self.track = track
        self.spans: list[tuple[int, int]] = []

    def take(self, lo: int, hi: int) -> int | None:
        """Hold [lo, hi] if it overlaps nothing held; None if it does. Returns the end
        to write: ``hi``, or 1 ns before a span held that begins at ``hi``.

        trace_processor orders the events of one timestamp by their place in
        the file: a slice written after its neighbour and ending where that
        one begins would close that one instead (Ray's times are µs: the ns
        taken off is below what the file says). One beginning where a span
        ends is fine: that span's end is earlier in the file.
        """
        spans = self.spans
        i = bisect.bisect_left(spans, (lo, hi))
        if i > 0 and spans[i - 1][1] > lo:
            return None
        if i < len(spans) and spans[i][0] < hi:
            return None
        if i < len(spans) and spans[i][0] == hi and hi > lo:
            hi -= 1
        spans.insert(i, (lo, hi))
        if len(spans) > _MAX_SPANS:
            k = min(range(len(spans) - 1), key=lambda j: spans[j + 1][0] - spans[j][1])
            spans[k : k + 2] = [(spans[k][0], spans[k + 1][1])]
        return hi


class _Thread:
    """A worker's (or driver's) thread track, its lanes, and its events held for a task."""

    __slots__ = ("lanes", "name", "pending", "pid", "track")

    def __init__(self, track: Track, pid: int, name: str) -> None:
        self.track = track
        self.pid = pid
        self.name = name
        self.lanes: list[_Lane] = [_Lane(track)]
        self.pending: list[tuple[int, int, str, dict[str, Any]]] = []


class _Converter:
    def __init__(
        self, w: TraceWriter, names: dict[tuple[str, str | None], str], stats: Stats
    ) -> None:
        self.w = w
        self.names = names
        self.stats = stats
        self.nodes: dict[str, int] = {}
        self.threads: dict[tuple[str, str], _Thread] = {}

    def add(self, ev: dict[str, Any]) -> None:
        ph = ev.get("ph")
        if ph == "M":
            return
        ts: Any = ev.get("ts")
        dur: Any = ev.get("dur", 0)
        if ph != "X" or not _number(ts) or not _number(dur) or dur < 0:
            self.stats.skipped += 1
            if ph in ("B", "E"):
                self.stats.begin_end += 1
            return
        start = round(ts * 1000)
        end = start + round(dur * 1000)
        thread = self._thread(str(ev.get("pid")), str(ev.get("tid")))
        cat = str(ev.get("cat") or "")
        raw = ev.get("args")
        args: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if cat.startswith("task::"):
            self._task(thread, ev, cat, start, end, args)
            return
        name = _PHASES.get(cat) or str(ev.get("name") or cat or "event")
        kept = {k: _scalar(args[k]) for k in _ARGS if k in args and k != "name"}
        thread.pending.append((start, end, name, kept))
        if len(thread.pending) > _MAX_PENDING:
            self._write_group(thread, None)

    def _task(
        self, thread: _Thread, ev: dict[str, Any], cat: str, start: int, end: int,
        args: dict[str, Any],
    ) -> None:
        """A task's own slice: written with the held events that fall inside it."""
        name = cat[len("task::"):] or str(ev.get("name") or "task")
        kept: dict[str, Any] = {k: _scalar(args[k]) for k in _ARGS if k in args}
        inside = [p for p in thread.pending if start <= p[0] and p[1] <= end]
        outside = [p for p in thread.pending if not (start <= p[0] and p[1] <= end)]
        thread.pending = outside
        self.stats.tasks += 1
        self._write_group(thread, (start, end, L.RAY_TASK_PREFIX + name, kept), inside)

    def _write_group(
        self, thread: _Thread, root: tuple[int, int, str, dict[str, Any]] | None,
        children: list[tuple[int, int, str, dict[str, Any]]] | None = None,
    ) -> None:
        """Write a task with its phases (or held events on their own) on a lane they fit."""
        if root is None:
            group = sorted(thread.pending, key=lambda p: (p[0], -p[1]))
            thread.pending = []
            for item in group:
                self._write(thread, item[0], item[1], [item])
            return
        items = [root, *sorted(children or [], key=lambda p: (p[0], -p[1]))]
        self._write(thread, root[0], root[1], items)

    def _write(
        self, thread: _Thread, lo: int, hi: int, items: list[tuple[int, int, str, dict[str, Any]]]
    ) -> None:
        lane, last = self._lane(thread, lo, hi)
        w = self.w
        stack: list[int] = []
        for start, end, name, args in items:
            if end > last:  # ends where the lane's next span begins: 1 ns before it
                start, end = min(start, last), last
            while stack and stack[-1] <= start:
                w.end(lane.track, stack.pop())
            if stack:  # clamp into the enclosing slice (Ray's phases end inside their task)
                end = min(end, stack[-1])
            w.begin(lane.track, name, start, category=L.CAT_RAY, args=args or None)
            stack.append(end)
            self.stats.slices += 1
        while stack:
            w.end(lane.track, stack.pop())

    def _lane(self, thread: _Thread, lo: int, hi: int) -> tuple[_Lane, int]:
        """The first lane of the thread with room for [lo, hi] (see :class:`_Lane`), and
        the end to write there; tasks that overlap (threaded actors) go on lanes of their
        own."""
        for lane in thread.lanes:
            end = lane.take(lo, hi)
            if end is not None:
                return lane, end
        lane = _Lane(self.w.track(thread.name, parent=thread.track))
        lane.take(lo, hi)
        thread.lanes.append(lane)
        return lane, hi

    def _thread(self, pid: str, tid: str) -> _Thread:
        thread = self.threads.get((pid, tid))
        if thread is not None:
            return thread
        node = self.nodes.get(pid)
        if node is None:
            node = self.nodes[pid] = _PID_BASE + len(self.nodes)
            label = self.names.get((pid, None)) or f"{L.NODE_PROCESS_PREFIX} {pid}"
            self.w.process_track(node, label, rank=len(self.nodes))
            self.stats.nodes += 1
        name = _thread_name(self.names.get((pid, tid)) or tid)
        tid_num = len(self.threads) + 1
        track = self.w.thread_track(node, _TID_BASE + tid_num, name)
        thread = self.threads[(pid, tid)] = _Thread(track, node, name)
        self.stats.workers += 1
        return thread

    def flush_all(self) -> None:
        for thread in self.threads.values():
            if thread.pending:
                self._write_group(thread, None)


def _thread_name(tid: str) -> str:
    """``worker:<hex id>`` as ``worker 1a2b3c4d`` (the id's first 8 characters)."""
    kind, sep, ident = tid.partition(":")
    if sep and kind in ("worker", "driver") and ident:
        return f"{kind} {ident[:8]}"
    return tid


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _scalar(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value if value is not None else ""
    return str(value)

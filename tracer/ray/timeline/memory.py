"""The memory part of a runner trace: requested vs actual, per task, worker, node, stage.

:class:`MemoryTrace` is part of :class:`~tracer.ray.timeline.RunTimeline`
(which owns it). For every execution it is given, it

* returns the execution slice's memory annotations (names in
  :mod:`tracer.ray.layout`): ``memory_requested``, ``memory_peak``,
  ``over_request`` when the peak exceeds a non-zero request, ``uss_peak``
  when the engine measured one (the peak is then the heap's, else it), and at level 2
  ``heap_peak``, ``allocations``, ``heap_retained``, ``rss_peak`` (and
  ``memray`` when memray did not measure the task alone);
* queues samples for the worker's **heap** and **RSS** counters (under the
  worker's track), written sorted by time at each :meth:`settle`: memray's
  snapshots, and the task's heap peak where no snapshot shows it (at the
  ``heap_peak_at_ns`` the worker gives, see :mod:`tracer.ray.memory`), so that
  the counter reaches every task's ``heap_peak``;
* queues the step changes of the node's **memory requested** and **memory
  used (task peaks)** counters (under the node's track, on one y axis).

Executions arrive late (when the runner receives tasks, drained once per
wave), so node counters are written only for the settled past: at each
:meth:`settle` the producer passes a *watermark*, the earliest dispatch time of
the tasks whose executions have not arrived yet (nothing can still start
before it), and the steps up to it are written; the rest wait for a later
settle or for the end (``settle(None)``). A step that arrives behind what was
already written (clock skew between nodes, measurements from the metrics
actor) is moved to the last written time, so the running totals stay right.

Sizes: every counter lives on a :class:`~tracer.format.writer.CounterSequence`
of its own per worker / node (delta timestamps in units of 0.1 ms, values in
KiB with ``unit_multiplier=1024``): a packet with both tracks of a pair is
~18 bytes (9 per value), one with a single value ~15, and a sample equal to
the previous one on its track is not written. The more frequently changing
track of each pair comes first (RSS; memory used), as the first needs no
uuid in its packets.
"""

from __future__ import annotations

import bisect
import heapq
from operator import itemgetter
from typing import Any

from tracer.format import CounterSequence, TraceWriter, Track
from tracer.ray import layout as L
from tracer.ray.levels import TracingLevel
from tracer.ray.timeline.nodes import NODE_COUNTER_RANK, WORKER_COUNTER_RANK

__all__ = ["MemoryTrace", "kib"]

_NS_PER_MS = 1_000_000
_TIME = itemgetter(0)  # a sample's time
#: Time unit of the memory counters' sequences: 0.1 ms. memray's snapshots are
#: 10 ms apart with ms timestamps, so a snapshot's delta is one byte (under
#: 12.8 ms) and a gap between tasks two (under 1.6 s).
TIME_UNIT_NS = 100_000


def kib(nbytes: int) -> int:
    """Bytes to the KiB that memory counters store (rounded to nearest)."""
    return (int(nbytes) + 512) >> 10


class _WorkerCounters:
    __slots__ = ("pending", "sequence", "with_heap")

    def __init__(self, sequence: CounterSequence, with_heap: bool) -> None:
        self.sequence = sequence
        self.with_heap = with_heap
        # (ts, order, heap KiB or None, rss KiB or None); order keeps one task's samples in order
        self.pending: list[tuple[int, int, int | None, int | None]] = []


class _NodeCounters:
    __slots__ = ("events", "last_ts", "requested", "sequence", "used")

    def __init__(self, sequence: CounterSequence) -> None:
        self.sequence = sequence
        self.events: list[tuple[int, int, int, int]] = []  # heap of (ts, order, d_req, d_used)
        self.requested = 0
        self.used = 0
        self.last_ts = 0


class MemoryTrace:
    """Requested vs actual memory of a runner's tasks; see the module doc."""

    def __init__(self, writer: TraceWriter, level: int) -> None:
        self.writer = writer
        self.level = int(level)
        self._workers: dict[Track, _WorkerCounters] = {}
        self._nodes: dict[Track, _NodeCounters] = {}
        self._order = 0

    # ------------------------------------------------------------ executions

    def execution(
        self,
        m: dict[str, Any],
        requested: int | None,
        node: Track,
        worker: Track,
        start: int,
        end: int,
    ) -> tuple[dict[str, Any], int | None, bool]:
        """One execution's annotations, its actual peak and whether it is over its request.

        Also queues its worker and node counter samples.
        """
        args: dict[str, Any] = {}
        if requested is not None:
            args[L.ARG_MEMORY_REQUESTED] = int(requested)
        heap_peak = _int_or_none(m.get("heap_peak"))
        uss_peak = _int_or_none(m.get("uss_peak"))
        rss_peak = _int_or_none(m.get("rss_peak"))
        # The heap's peak when memray measured it, else the larger of the USS's and the
        # private RSS's (Ray Data samples the USS once a second: a short task's is its
        # worker's baseline; the RSS's is the task's own high-water mark).
        peak: int | None
        if heap_peak is not None:
            peak = heap_peak
        elif uss_peak is not None and (rss_peak is None or uss_peak >= rss_peak):
            peak = uss_peak
        else:
            peak = rss_peak
        if peak is not None:
            args[L.ARG_MEMORY_PEAK] = peak
        over = bool(requested) and peak is not None and peak > int(requested or 0)
        if over:
            args[L.ARG_OVER_REQUEST] = True
        if uss_peak is not None:
            args[L.ARG_USS_PEAK] = uss_peak
        if heap_peak is not None:
            args[L.ARG_HEAP_PEAK] = heap_peak
            for key, name in (
                ("allocations", L.ARG_ALLOCATIONS),
                ("heap_retained", L.ARG_HEAP_RETAINED),
                ("total_allocated", L.ARG_TOTAL_ALLOCATED),
                ("allocation_count", L.ARG_ALLOCATION_COUNT),
                ("rss_peak", L.ARG_RSS_PEAK),
            ):
                value = _int_or_none(m.get(key))
                if value is not None:
                    args[name] = value
        status = m.get("memray")
        if status:
            args[L.ARG_MEMRAY] = str(status)
            if m.get("memray_reason"):
                args[L.ARG_MEMRAY_REASON] = str(m["memray_reason"])[:200]
        self._queue_worker_samples(m, worker, start, end, heap_peak)
        if requested or peak:
            self._queue_node_steps(node, start, end, int(requested or 0), int(peak or 0))
        return args, peak, over

    def _worker_counters(self, worker: Track) -> _WorkerCounters:
        counters = self._workers.get(worker)
        if counters is None:
            w = self.writer
            # RSS first: it changes at almost every sample, and the first track of
            # a sequence needs no uuid in its packets (the heap is an extra value).
            tracks = [
                w.counter_track(
                    L.COUNTER_WORKER_RSS, parent=worker, unit="bytes", unit_multiplier=1024,
                    rank=WORKER_COUNTER_RANK,
                    description="The worker process's resident memory (RSS)",
                )
            ]
            with_heap = self.level >= TracingLevel.MEMORY
            if with_heap:
                tracks.append(
                    w.counter_track(
                        L.COUNTER_WORKER_HEAP, parent=worker, unit="bytes", unit_multiplier=1024,
                        rank=WORKER_COUNTER_RANK + 1,
                        description="Heap of the task running in the worker (memray); "
                        "0 between tasks",
                    )
                )
            counters = self._workers[worker] = _WorkerCounters(
                w.counter_sequence(tracks, time_unit_ns=TIME_UNIT_NS), with_heap
            )
        return counters

    def _queue_worker_samples(
        self, m: dict[str, Any], worker: Track, start: int, end: int, heap_peak: int | None
    ) -> None:
        counters = self._worker_counters(worker)
        pending = counters.pending
        tracked = heap_peak is not None  # memray measured the task
        heap0 = 0 if tracked and counters.with_heap else None
        first: tuple[int, int | None, int | None] = (start, heap0, _kib_or_none(m.get("rss_start")))
        inside: list[tuple[int, int, int | None]] = []
        samples = m.get("memory_samples") if tracked and counters.with_heap else None
        for t_ms, heap, rss in samples or ():
            ts = int(t_ms) * _NS_PER_MS
            if ts <= start:  # taken as the tracker started: the latest is the start sample
                first = (start, kib(heap), kib(rss))
            elif ts < end:  # after the end (the tracker stopping) belongs to no task
                inside.append((ts, kib(heap), kib(rss)))
        at = _int_or_none(m.get("heap_peak_at_ns")) if heap0 is not None else None
        if at is not None and heap_peak is not None:
            # A peak no snapshot shows (held for less than memray's 10 ms): a
            # sample of it where it fell, so the counter reaches the task's heap_peak.
            bisect.insort(inside, (min(max(at, start), end), kib(heap_peak), None), key=_TIME)
        order = self._order
        pending.append((first[0], order, first[1], first[2]))
        for ts, heap_kib, rss_kib in inside:
            order += 1
            pending.append((ts, order, heap_kib, rss_kib))
        pending.append((end, order + 1, heap0, _kib_or_none(m.get("rss_end"))))
        self._order = order + 2

    def killed(self, node: Track, start: int, end: int, requested: int, used: int) -> None:
        """A task Ray's OOM killer killed on that node: it held its request and ``used``
        (its worker's memory at the kill) from ``start`` to the kill, on the node's
        counters; it has no execution to put them there."""
        if requested or used:
            self._queue_node_steps(node, start, end, int(requested), int(used))

    def worker_gone(self, worker: Track, ts: int) -> None:
        """The worker process ended at ``ts`` (Ray's OOM killer): its counters drop to 0
        there, where they would have kept its last task's figures to the trace's end."""
        counters = self._workers.get(worker)
        if counters is not None:
            self._order += 1
            counters.pending.append(
                (ts, self._order, 0 if counters.with_heap else None, 0)
            )

    def _queue_node_steps(
        self, node: Track, start: int, end: int, requested: int, used: int
    ) -> None:
        counters = self._nodes.get(node)
        if counters is None:
            w = self.writer
            # "used" first: it changes at every step, "requested" not for unrequested tasks.
            tracks = [
                w.counter_track(
                    L.COUNTER_NODE_MEMORY_USED, parent=node, unit="bytes", unit_multiplier=1024,
                    rank=NODE_COUNTER_RANK + 1, y_axis_share_key=L.NODE_MEMORY_AXIS,
                    description="Peak memory of the tasks running on the node, summed "
                    "(same scale as the memory requested)",
                ),
                w.counter_track(
                    L.COUNTER_NODE_MEMORY_REQUESTED, parent=node, unit="bytes",
                    unit_multiplier=1024, rank=NODE_COUNTER_RANK,
                    y_axis_share_key=L.NODE_MEMORY_AXIS,
                    description="Memory requested (memory=) by the tasks running on the node",
                ),
            ]
            counters = self._nodes[node] = _NodeCounters(
                w.counter_sequence(tracks, time_unit_ns=TIME_UNIT_NS)
            )
        self._order += 1
        heapq.heappush(counters.events, (start, self._order, requested, used))
        self._order += 1
        heapq.heappush(counters.events, (max(end, start), self._order, -requested, -used))

    # ---------------------------------------------------------------- output

    def settle(self, watermark: int | None) -> None:
        """Write the queued worker samples, and the node steps up to ``watermark`` (None: all)."""
        for counters in self._workers.values():
            if not counters.pending:
                continue
            pending, counters.pending = counters.pending, []
            pending.sort()
            sample = counters.sequence.sample
            if counters.with_heap:
                for ts, _, heap, rss in pending:
                    sample(ts, rss, heap)
            else:
                for ts, _, _, rss in pending:
                    sample(ts, rss)
        for node in self._nodes.values():
            events = node.events
            while events and (watermark is None or events[0][0] <= watermark):
                ts = max(events[0][0], node.last_ts)
                # Every step at this time first, then one sample.
                while events and max(events[0][0], node.last_ts) == ts and (
                    watermark is None or events[0][0] <= watermark
                ):
                    _, _, d_req, d_used = heapq.heappop(events)
                    node.requested += d_req
                    node.used += d_used
                node.last_ts = ts
                node.sequence.sample(ts, kib(node.used), kib(node.requested))


def _kib_or_none(nbytes: Any) -> int | None:
    value = _int_or_none(nbytes)
    return None if value is None else kib(value)


def _int_or_none(value: Any) -> int | None:
    if value.__class__ is int:  # what a task reports (the common case, first)
        return value
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None

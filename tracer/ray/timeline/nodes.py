"""Nodes and their workers: where each execution ran.

A Ray node is a track ("Node 0 (b7ea05a7)") under the run's root, and each
worker process on it a track under the node named by its real pid
("worker 6550"); both are created the first time an execution (or a
failure) names them, numbered and ordered in that order. They are plain
tracks, not process and thread tracks: real worker pids repeat across the
machines of a cluster, and the Perfetto UI appends a process's pid and a
thread's tid to its name, which would show synthetic ids.

A worker's track holds its executions; under it, in this order, the lanes
of executions that overlap (a threaded actor runs several at once; same
name: the UI merges them, so slices never overlap on one track), Ray's
phases and the worker's memory counters (:mod:`.memory`). A node's memory
counters come before its workers (:data:`NODE_COUNTER_RANK`).
"""

from __future__ import annotations

from bisect import bisect_right, insort
from operator import itemgetter

from tracer.format import TraceWriter, Track
from tracer.ray import layout as L

__all__ = ["Node", "Nodes", "Worker"]

#: Ranks under a node: its memory counters first, then its workers in the
#: order they were seen (from WORKER_RANK_BASE).
NODE_COUNTER_RANK = 0
WORKER_RANK_BASE = 10
#: Ranks under a worker: the execution lanes, Ray's phases, then its counters.
LANE_RANK = 0
RAY_PHASES_RANK = 1
WORKER_COUNTER_RANK = 2
#: At most this many of a worker track's executions are kept (to place one drawn late in its
#: gap); fewer once the producer says how early an execution still to come can start.
_RECENT = 1024
_END = itemgetter(1)


class Worker:
    __slots__ = ("floor", "lanes", "pid", "ray_lanes", "recent", "track")

    def __init__(self, track: Track, pid: int) -> None:
        self.track = track
        self.pid = pid
        #: (start, end) of the executions on the worker's track, by start (and so by end:
        #: they do not overlap), since ``floor``: those that ended before it were let go.
        self.recent: list[tuple[int, int]] = []
        self.floor = 0
        self.lanes: list[tuple[Track, int]] = []
        #: Tracks of Ray's phases under the worker, with the end of their last slice.
        self.ray_lanes: list[tuple[Track, int]] = []


class Node:
    __slots__ = ("index", "node_id", "track", "workers")

    def __init__(self, index: int, node_id: str, track: Track) -> None:
        self.index = index
        self.node_id = node_id
        self.track = track
        self.workers: dict[int, Worker] = {}


class Nodes:
    """The run's nodes by Ray node id, and their workers by pid.

    Nodes go under ``root`` (ordered explicitly), at ranks from ``first_rank``.
    """

    def __init__(self, writer: TraceWriter, root: Track | None = None, first_rank: int = 0) -> None:
        self.writer = writer
        self.root = root
        self.first_rank = first_rank
        self.by_id: dict[str, Node] = {}

    def node(self, node_id: str) -> Node:
        node = self.by_id.get(node_id)
        if node is None:
            index = len(self.by_id)
            label = node_id[:8] if node_id else "unknown"
            track = self.writer.track(
                f"{L.NODE_PROCESS_PREFIX} {index} ({label})", parent=self.root,
                rank=self.first_rank + index, child_ordering="explicit", merge=False,
                description=f"Ray node {node_id or 'unknown'}: its memory, its worker processes",
            )
            node = self.by_id[node_id] = Node(index, node_id, track)
        return node

    def worker(self, node: Node, pid: int) -> Worker:
        worker = node.workers.get(pid)
        if worker is None:
            track = self.writer.track(
                f"{L.WORKER_THREAD_PREFIX} {pid}", parent=node.track,
                rank=WORKER_RANK_BASE + len(node.workers), child_ordering="explicit",
                merge=False,
                description=f"Ray worker process {pid}: the executions it ran, its memory",
            )
            worker = node.workers[pid] = Worker(track, pid)
        return worker

    def locate(self, node_id: str | None, pid: int) -> Track:
        """The track of the worker (or node) an error names; an error that names only
        the worker's pid (a cancelled task's) is placed on the node that worker is known on."""
        if node_id is None and pid:
            known = [n for n in self.by_id.values() if pid in n.workers]
            if len(known) == 1:
                return known[0].workers[pid].track
        node = self.node(node_id or "unknown")
        return self.worker(node, pid).track if pid else node.track

    def execution_track(self, worker: Worker, start: int, end: int) -> Track:
        """The worker's track, or a lane under it when executions overlap (threaded actors).

        Executions are drawn as the runner receives their tasks, not always in
        the order they ran: one received after a later one of the same worker
        goes on the worker's track when it fits in the gap it ran in. A lane
        only for it would show a worker running two tasks at once (before: ~1
        in 2000 level-1 executions of a 2-core run, 90 in 2000 with executions
        from Ray's events, which come a read late). The worker keeps its
        executions until the producer's watermark (:meth:`forget_before`, at
        each settle) or at most ``_RECENT`` of them. It must end strictly
        before the next one starts: the next one's begin is already in the
        file, and trace_processor orders events of one timestamp by file
        position, so an end at that same timestamp would close the wrong slice.
        """
        recent = worker.recent
        if start >= (recent[-1][1] if recent else worker.floor):  # in order: the common case
            recent.append((start, end))
        elif self._fits(worker, start, end):
            insort(recent, (start, end))
        else:
            return self._lane(worker, start, end)
        if len(recent) > _RECENT:
            worker.floor = max(worker.floor, recent.pop(0)[1])
        return worker.track

    @staticmethod
    def _fits(worker: Worker, start: int, end: int) -> bool:
        """Does [start, end] fall in a gap between the worker track's recent executions?"""
        if start < worker.floor:
            return False  # among executions let go: the gap is not known
        recent = worker.recent
        i = bisect_right(recent, (start, end))  # past the last only overlapping it (checked first)
        return (i == 0 or recent[i - 1][1] <= start) and end < recent[i][0]

    def _lane(self, worker: Worker, start: int, end: int) -> Track:
        """A lane under the worker free from ``start`` (a new one when none is)."""
        for i, (lane, lane_end) in enumerate(worker.lanes):
            if start >= lane_end:
                worker.lanes[i] = (lane, end)
                return lane
        lane = self.writer.track(
            f"{L.WORKER_THREAD_PREFIX} {worker.pid}", parent=worker.track, rank=LANE_RANK
        )
        worker.lanes.append((lane, end))
        return lane

    def forget_before(self, watermark: int) -> None:
        """No execution still to come starts before ``watermark``: let go of the workers'
        executions that ended by then (they can border no gap still to fill)."""
        for node in self.by_id.values():
            for worker in node.workers.values():
                recent = worker.recent
                n = bisect_right(recent, watermark, key=_END)  # their ends are in order too
                if n:
                    worker.floor = max(worker.floor, recent[n - 1][1])
                    del recent[:n]

    def ray_phases_track(self, worker: Worker, start: int, end: int) -> Track:
        """The worker's track of Ray's phases free from ``start`` (one more when they overlap).

        A lane is free when its last slice ended before ``start``. The channel
        draws each batch of Ray's events in order of time, so a worker's tasks,
        one after another, share one lane; one whose events came late, after
        later tasks', takes another lane rather than break the nesting.
        """
        for i, (lane, lane_end) in enumerate(worker.ray_lanes):
            if start >= lane_end:
                worker.ray_lanes[i] = (lane, end)
                return lane
        lane = self.writer.track(L.RAY_PHASES_TRACK, parent=worker.track, rank=RAY_PHASES_RANK)
        worker.ray_lanes.append((lane, end))
        return lane

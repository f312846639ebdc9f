"""Nodes and their workers: where each execution ran.

A Ray node is a process track ("Node 0 (b7ea05a7)") and each worker process
on it a thread track ("worker 6550"), both created the first time an
execution (or a failure) names them, numbered in that order. Their pids and
tids are synthetic: real worker pids repeat across the machines of a
cluster, and trace_processor keys threads by tid.

Executions of one worker normally follow each other; a threaded actor runs
several at once, and those go on lanes under the worker's track (same name:
the UI merges them), so that slices never overlap on one track.
"""

from __future__ import annotations

from tracer.format import TraceWriter, Track
from tracer.ray import layout as L

__all__ = ["Node", "Nodes", "Worker"]

#: Node process pids: far above the driver's own (real) pid.
NODE_PID_BASE = 2_000_000_000
#: Linux pids (and the driver's own tids) are below 2**22: a worker's tid is its
#: pid in its node's own block of that size, so tids stay below 2**32 (a larger
#: one is truncated by trace_processor, which then shows a phantom thread).
_PID_SPACE = 1 << 22
_NODE_BLOCKS = (1 << 32) // _PID_SPACE - 1


class Worker:
    __slots__ = ("lanes", "last_end", "pid", "ray_lanes", "track")

    def __init__(self, track: Track, pid: int) -> None:
        self.track = track
        self.pid = pid
        self.last_end = 0
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
    """The run's nodes by Ray node id, and their workers by pid."""

    def __init__(self, writer: TraceWriter) -> None:
        self.writer = writer
        self.by_id: dict[str, Node] = {}

    def node(self, node_id: str) -> Node:
        node = self.by_id.get(node_id)
        if node is None:
            index = len(self.by_id)
            label = node_id[:8] if node_id else "unknown"
            track = self.writer.process_track(
                NODE_PID_BASE + index, f"{L.NODE_PROCESS_PREFIX} {index} ({label})",
                rank=1 + index,
            )
            node = self.by_id[node_id] = Node(index, node_id, track)
        return node

    def worker(self, node: Node, pid: int) -> Worker:
        worker = node.workers.get(pid)
        if worker is None:
            tid = (node.index % _NODE_BLOCKS + 1) * _PID_SPACE + pid % _PID_SPACE
            track = self.writer.thread_track(
                NODE_PID_BASE + node.index, tid, f"{L.WORKER_THREAD_PREFIX} {pid}"
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
        """The worker's track, or a lane under it when executions overlap (threaded actors)."""
        if start >= worker.last_end:
            worker.last_end = end
            return worker.track
        for i, (lane, lane_end) in enumerate(worker.lanes):
            if start >= lane_end:
                worker.lanes[i] = (lane, end)
                return lane
        lane = self.writer.track(f"{L.WORKER_THREAD_PREFIX} {worker.pid}", parent=worker.track)
        worker.lanes.append((lane, end))
        return lane

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
        lane = self.writer.track(L.RAY_PHASES_TRACK, parent=worker.track)
        worker.ray_lanes.append((lane, end))
        return lane

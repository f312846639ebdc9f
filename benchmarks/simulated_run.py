"""A runner trace of any size in seconds: the reference runner's calls, simulated, without Ray.

:func:`write_run` drives a real :class:`tracer.ray.RunnerTracer` (so the
trace has the layout, annotations, lanes, flows, counters and compression of
a real level-1 run) the way ``tracer.runner.Pipeline`` does: waves of plan
polling, batching, dispatching and awaiting; tasks created, dispatched and
received in batches; stages finished when their last task is received. Time
is a fake clock that the simulation advances, and the tasks' measurements
(where and when each ran, the worker's RSS) are made up by the simulation
and handed to the tracer where Ray's return channel would hand them over:
packed by the worker side's own ``pack_metrics`` and read back by the
tracer's own code. Nothing else is faked.

The simulated cluster has ``nodes`` nodes of ``workers_per_node`` workers;
each stage has ``tasks / stages`` partitions, and a partition's task in a
stage is created when its task of the previous stage was received (a map
pipeline). Seeded: the same arguments write the same trace (but for the wall
clock of the recording, in its first packet).
"""

from __future__ import annotations

import heapq
import random
from pathlib import Path
from typing import Any

from tracer.format import TraceWriter
from tracer.ray import ResourceRequest
from tracer.ray.flusher import MIN_FLUSH_GAP_S
from tracer.ray.levels import TracingLevel
from tracer.ray.return_channel import ReturnChannel
from tracer.ray.runner_tracer import RunnerTracer
from tracer.ray.task_metrics import pack_metrics, unpack_metrics

__all__ = ["write_run"]

MIB = 1 << 20
START_NS = 1_700_000_000_000_000_000


class _Clock:
    """The fake clock the writer (and so the tracer) reads: ns, advanced by hand."""

    __slots__ = ("ns",)

    def __init__(self) -> None:
        self.ns = START_NS

    def __call__(self) -> int:
        return self.ns

    def advance(self, ns: int) -> None:
        self.ns += max(1, ns)


class _SimulatedReturns(ReturnChannel):
    """The return channel with the measurements coming from the simulation instead of Ray.

    The one method that talks to Ray for them (one ``ray.get`` for a batch of
    return values) unpacks the packed measurements registered as the tasks'
    "refs" instead; everything else is the tracer's own code.
    """

    def fetch(self, tasks: list[Any]) -> dict[str, BaseException]:
        for task in tasks:
            task.metrics = unpack_metrics(task.metrics_ref)
        return {}


class _FakeClockFlusher:
    """The flusher's rule (write out within 20 ms of a wave's end) on the fake clock.

    The real flusher is a thread on the real clock: where its writes fell in a
    simulated run (so where the compressed bundles begin and end) changed from
    one run to the next, and a seeded run must write the same bytes.
    """

    def __init__(self, flush: Any, clock: _Clock) -> None:
        self._flush = flush
        self._clock = clock
        self.wave_ended = False
        self.last_flush = 0.0
        self._flushed_ns = clock.ns

    def after_wave(self) -> None:
        if self.wave_ended and self._clock.ns - self._flushed_ns >= MIN_FLUSH_GAP_S * 1e9:
            self.wave_ended = False
            self._flushed_ns = self._clock.ns
            self._flush()

    def stop(self, join: bool = False) -> None:
        pass


class _SimulatedRayTracer(RunnerTracer):
    """A RunnerTracer with the simulation's return channel, flushed on the fake clock."""

    def __init__(self, *args: Any, clock: _Clock, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._returns = _SimulatedReturns(self._returns.timeline)
        self._flusher.stop(join=True)
        self._flusher = _FakeClockFlusher(self.flush, clock)  # type: ignore[assignment]


def write_run(
    path: str | Path,
    tasks: int,
    *,
    stages: int = 2,
    nodes: int = 1,
    workers_per_node: int = 2,
    task_ms: float = 1.0,
    seed: int = 0,
    compress: bool = True,
) -> Path:
    """Write a level-1 trace of ``tasks`` tasks (``stages`` map stages) to ``path``."""
    path = Path(path)
    rng = random.Random(seed)
    clock = _Clock()
    writer = TraceWriter(path, compress=compress, clock=clock)
    workers = [  # (node id, worker pid)
        (f"{n:02x}" * 28, 10_000 + n * 1000 + w)
        for n in range(nodes)
        for w in range(workers_per_node)
    ]
    cpus = len(workers)
    tracer = _SimulatedRayTracer(
        writer,
        execution_id="simulated",
        runner_name="pipeline",
        level=TracingLevel.TIMELINE,
        clock=clock,
        ray_events=False,  # no Ray: the tasks' Ray ids are made up
        cluster_resources={"CPU": float(cpus), "memory": float(cpus * 1024 * MIB)},
    )
    names = [f"map{i}" for i in range(stages)]
    requests = [ResourceRequest(num_cpus=1, memory_bytes=64 * MIB) for _ in range(stages)]
    partitions = max(1, tasks // stages)
    ready: list[tuple[int, int]] = [(0, p) for p in range(partitions)]  # (stage, partition) to run
    ready.reverse()
    free_at = {pid: clock.ns for _, pid in workers}  # when each worker is next free
    base_rss = {pid: 120 * MIB + rng.randrange(8 * MIB) for _, pid in workers}
    rss = dict(base_rss)
    inflight: list[tuple[int, str, int, int]] = []  # heap: (done_ns, task id, stage, partition)
    received = [0] * stages
    max_inflight = 2 * cpus
    worker_turn = 0
    try:
        wave = 0
        while ready or inflight:
            with tracer.dispatch_wave(wave) as wave_metrics:
                batch: list[tuple[str, int, int]] = []
                with tracer.dispatch_batching():
                    while True:
                        with tracer.get_next_physical_plan() as update:
                            clock.advance(rng.randrange(2_000, 6_000))
                            if not ready:
                                update(next_item_type="none")
                                task = None
                            elif len(inflight) + len(batch) >= max_inflight:
                                update(next_item_type="blocked on resources")
                                break
                            else:
                                stage, partition = task = ready.pop()
                                task_id = f"{stage}-{partition}"
                                tracer.task_created(
                                    task_id, stage, requests[stage], names[stage],
                                    stage_name=names[stage],
                                )
                                update(next_item_type="task")
                        if task is None:
                            tracer.mark_handle_none_task()
                            break
                        tracer.mark_handle_task_add_to_batch()
                        batch.append((task_id, stage, partition))
                        clock.advance(rng.randrange(1_000, 3_000))
                if batch:
                    with tracer.dispatching():
                        for task_id, stage, partition in batch:
                            clock.advance(rng.randrange(150_000, 250_000))
                            tracer.task_dispatched(task_id)
                            node_id, pid = workers[worker_turn % len(workers)]
                            worker_turn += 1
                            start = max(clock.ns + rng.randrange(200_000, 600_000), free_at[pid])
                            end = start + int(task_ms * 1e6 * rng.uniform(0.7, 1.6))
                            free_at[pid] = end
                            rss_start = rss[pid]
                            # A worker's RSS wanders around its baseline (mean-reverting).
                            drift = (base_rss[pid] - rss_start) // 8
                            rss[pid] = rss_start + drift + rng.randrange(-256 * 1024, 256 * 1024)
                            metrics = {
                                "node_id": node_id,
                                "ray_task_id": f"{rng.getrandbits(112):028x}",
                                "assigned_resources": {"CPU": 1.0},
                                "pid": pid,
                                "rss_start": rss_start,
                                "start_ns": start,
                                "end_ns": end,
                                "rss_end": rss[pid],
                                "rss_peak": max(rss_start, rss[pid]) + rng.randrange(64 * 1024),
                            }
                            tracer.register_metrics_ref(task_id, pack_metrics(metrics))
                            tracer.mark_dispatch_task()
                            done = end + rng.randrange(100_000, 400_000)
                            heapq.heappush(inflight, (done, task_id, stage, partition))
                    tracer.count_inflight_tasks(len(inflight))
                done_now: list[tuple[str, int, int]] = []
                if inflight:
                    with tracer.awaiting(1, 0.1) as update:
                        first = inflight[0][0]
                        if first > clock.ns:
                            clock.advance(first - clock.ns)
                        while inflight and inflight[0][0] <= clock.ns:
                            _, task_id, stage, partition = heapq.heappop(inflight)
                            done_now.append((task_id, stage, partition))
                        clock.advance(rng.randrange(20_000, 60_000))
                        update(num_ready=len(done_now))
                    tracer.tasks_received_as_ready([t for t, _, _ in done_now])
                    for _, stage, partition in done_now:
                        clock.advance(rng.randrange(3_000, 10_000))
                        received[stage] += 1
                        if stage + 1 < stages:
                            ready.append((stage + 1, partition))
                        else:
                            tracer.mark_handle_materialized_result()
                        if received[stage] == partitions:
                            tracer.stage_done(stage)
                    tracer.count_inflight_tasks(len(inflight))
                wave_metrics(dispatched=len(batch), received=len(done_now), inflight=len(inflight))
            wave += 1
            tracer._flusher.after_wave()  # type: ignore[attr-defined]
        tracer.complete_received()
    finally:
        tracer.close()
    return path

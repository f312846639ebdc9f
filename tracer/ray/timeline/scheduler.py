"""The Scheduler's counters: tasks in flight and what is left of the cluster.

Under the run's *Scheduler* track, next to the dispatch loop: the run's
tasks in flight, each stage's tasks in flight, queued blocks and
backpressure, what the run holds of the object store, and the cluster's
available CPUs, GPUs, memory and object store.

Two ways to fill them, a producer uses one: the timeline's own accounting
(every dispatched task holds its request until released, subtracted from
the cluster's totals: the reference runner, Daft), or the producer's own
scheduler's figures (Ray Data's resource manager, :meth:`SchedulerCounters.sample_available`).
Every counter track is ranked: the UI puts unranked siblings of an
explicitly ordered track before the ranked ones, so a producer's counters
declared on first use came out mixed in with the rest.
"""

from __future__ import annotations

from typing import Any

from tracer.format import CounterTrack, TraceWriter, Track
from tracer.ray import layout as L
from tracer.ray.resources import ResourceRequest
from tracer.ray.timeline.stages import Stages

__all__ = ["SchedulerCounters", "number"]

# Ranks under the Scheduler, top down: the loop (0), the run's tasks in flight (1), each
# stage's tasks in flight, queued blocks and backpressure (in that order, stage by
# stage), what the run holds of the object store, then what is left of the cluster.
_RANK_INFLIGHT = 1
_RANK_STAGE_INFLIGHT = 2
_MAX_STAGE_RANK = 100_000
_STAGE_COUNTERS = 3  # per stage: tasks in flight, queued blocks, backpressured
_RANK_AVAILABLE = 1_000_000

#: A stage counter's kind (:meth:`SchedulerCounters.stage_counter`).
STAGE_INFLIGHT, STAGE_QUEUED, STAGE_BACKPRESSURED = 0, 1, 2


class SchedulerCounters:
    """The counters under ``scheduler`` and the accounting behind them."""

    def __init__(
        self,
        writer: TraceWriter,
        scheduler: Track,
        stages: Stages,
        cluster_resources: dict[str, float] | None,
    ) -> None:
        self.writer = w = writer
        self.scheduler = scheduler
        self._stages = stages
        self._inflight = w.counter_track(L.COUNTER_INFLIGHT, parent=scheduler, rank=_RANK_INFLIGHT)
        self._avail_cpus = w.counter_track(
            L.COUNTER_AVAILABLE_CPUS, parent=scheduler, rank=_RANK_AVAILABLE
        )
        self._avail_gpus = w.counter_track(
            L.COUNTER_AVAILABLE_GPUS, parent=scheduler, rank=_RANK_AVAILABLE + 1
        )
        self._avail_mem = w.counter_track(
            L.COUNTER_AVAILABLE_MEMORY, parent=scheduler, unit="bytes", rank=_RANK_AVAILABLE + 2,
        )
        # Counters a producer samples with figures of its own (declared on first use).
        self._stage_counters: dict[tuple[Any, int], CounterTrack] = {}
        self._avail_object_store: CounterTrack | None = None
        self._object_store_used: CounterTrack | None = None
        totals = cluster_resources or {}
        self._total_cpus = float(totals.get("CPU", 0.0))
        self._total_gpus = float(totals.get("GPU", 0.0))
        self._total_mem = float(totals.get("memory", 0.0))
        self._used_cpus = 0.0
        self._used_gpus = 0.0
        self._used_mem = 0.0
        # Tasks dispatched and not done: drawn as *tasks in flight* at each sample of
        # the resources for a runner that does not count them itself (Daft's loop).
        self._in_flight = 0
        self._dispatched_any = False  # (before, the runner may not have counted yet)
        self._producer_counts_in_flight = False
        self._changed = False  # a task dispatched or released since the sample

    # ------------------------------------------------------------ the accounting

    def hold(self, request: ResourceRequest) -> None:
        """A task was dispatched: it holds ``request`` until :meth:`give_back`."""
        self._used_cpus += request.num_cpus or 0
        self._used_gpus += request.num_gpus or 0
        self._used_mem += request.memory_bytes or 0
        self._in_flight += 1
        self._dispatched_any = True
        self._changed = True

    def give_back(self, request: ResourceRequest) -> None:
        """A dispatched task is done: what it held is available again."""
        self._used_cpus -= request.num_cpus or 0
        self._used_gpus -= request.num_gpus or 0
        self._used_mem -= request.memory_bytes or 0
        self._in_flight -= 1
        self._changed = True

    def memory_held_differs(self, delta: int) -> None:
        """A task in flight holds ``delta`` bytes more memory than its request said
        (Ray reserved another figure for it)."""
        self._used_mem += delta
        self._changed = True

    # ------------------------------------------------------------ samples

    def count_inflight(self, count: int) -> None:
        """The runner's own count of its tasks in flight (from then on the only one drawn)."""
        self._producer_counts_in_flight = True
        self.writer.counter(self._inflight, count)

    def sample(self) -> None:
        """Sample the available CPUs, GPUs and memory: totals less what dispatched tasks
        hold, never below 0.

        A runner may dispatch more than the cluster holds (Daft keeps ~90 tasks
        a CPU in flight): the rest wait in Ray's queue, which *tasks in flight*
        shows; "-179 CPUs available" read as a bug. A runner that does not count
        its tasks in flight gets the accounting's count (dispatched, not done) here.
        """
        self._changed = False
        w = self.writer
        if self._total_cpus:
            w.counter(self._avail_cpus, number(max(0.0, self._total_cpus - self._used_cpus)))
        if self._total_gpus:
            w.counter(self._avail_gpus, number(max(0.0, self._total_gpus - self._used_gpus)))
        if self._total_mem:
            w.counter(self._avail_mem, int(max(0.0, self._total_mem - self._used_mem)))
        if not self._producer_counts_in_flight and self._dispatched_any:
            w.counter(self._inflight, self._in_flight)

    def sample_if_changed(self) -> None:
        """:meth:`sample` if a task was dispatched or released since the last one."""
        if self._changed:
            self.sample()

    def sample_available(
        self,
        cpus: float | None,
        gpus: float | None,
        memory: float | None,
        object_store_memory: float | None,
    ) -> None:
        """Resources left as the producer's own scheduler counts them (None: not known)."""
        w = self.writer
        if cpus is not None:
            w.counter(self._avail_cpus, number(cpus))
        if gpus is not None:
            w.counter(self._avail_gpus, number(gpus))
        if memory is not None:
            w.counter(self._avail_mem, int(memory))
        if object_store_memory is not None:
            track = self._avail_object_store
            if track is None:
                track = self._avail_object_store = w.counter_track(
                    L.COUNTER_AVAILABLE_OBJECT_STORE, parent=self.scheduler, unit="bytes",
                    rank=_RANK_AVAILABLE + 3,
                )
            w.counter(track, int(object_store_memory))

    def count_object_store_used(self, nbytes: int) -> None:
        """Object-store memory held by the run's data (``COUNTER_OBJECT_STORE_USED``)."""
        track = self._object_store_used
        if track is None:
            track = self._object_store_used = self.writer.counter_track(
                L.COUNTER_OBJECT_STORE_USED, parent=self.scheduler, unit="bytes",
                rank=_RANK_AVAILABLE - 1,
            )
        self.writer.counter(track, int(nbytes))

    def count_stage(self, stage_id: Any, kind: int, value: int, name: str | None = None) -> None:
        """One sample of a stage's counter of ``kind`` (``STAGE_INFLIGHT``,
        ``STAGE_QUEUED``, ``STAGE_BACKPRESSURED``)."""
        self.writer.counter(self._stage_counter(stage_id, kind, name), value)

    def _stage_counter(self, stage_id: Any, kind: int, name: str | None) -> CounterTrack:
        """One of a stage's counters, declared on first use (named with ``name`` if the
        stage's first task is still to come)."""
        key = (stage_id, kind)
        track = self._stage_counters.get(key)
        if track is None:
            stage = self._stages.get(stage_id)
            label = (stage.track.name if stage is not None
                     else f"{stage_id}: {name}" if name else f"{stage_id}")
            # After the run's count, stage by stage in the stages' order (ids are the order
            # for both producers; any other id in the order of first use).
            n = len(self._stage_counters)
            rank = _RANK_STAGE_INFLIGHT + kind + _STAGE_COUNTERS * (
                stage_id if isinstance(stage_id, int) and 0 <= stage_id < _MAX_STAGE_RANK
                else _MAX_STAGE_RANK + n
            )
            template = (L.COUNTER_STAGE_INFLIGHT, L.COUNTER_STAGE_QUEUED,
                        L.COUNTER_STAGE_BACKPRESSURED)[kind]
            track = self._stage_counters[key] = self.writer.counter_track(
                template.format(stage=label), parent=self.scheduler, rank=rank
            )
        return track


def number(value: Any) -> int | float:
    """``value`` as an int where it is whole (a counter or annotation of 2, not 2.0)."""
    f = float(value)
    return int(f) if f.is_integer() else f

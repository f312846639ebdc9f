"""The driver's Python garbage collector: its long pauses, for the dispatch loop's track.

A dispatch loop that stands still for tens of milliseconds with nothing to
say why is often the driver's own cycle collector. A full collection walks
every object the driver holds, Ray's with them: ~50-70 ms in a driver of a
few hundred thousand objects (a level-1 run of 10,000 tasks,
benchmarks/README.md). It holds the GIL throughout, so the loop waits
whichever thread set it off. The trace showed a loop phase that long and
nothing else; now the pauses are slices of their own under the loop.

What it costs: a callback at the start and end of every collection
(``gc.callbacks``), ~1.9 µs a collection against 0.07 for a young collection
without it, of which 1.2 is what any callback costs (Python builds its info
dict for each call); measured on a loaded machine, 20,000 young collections,
7 runs. A level-1 driver of 2000 no-op tasks runs ~90-200 collections (93,
6.7 ms in all, in a run after a warm-up): ~0.1-0.2 µs a task. Only a pause of
at least ``min_pause_ns`` becomes a slice.

The callback runs in whichever thread allocated, possibly inside the
tracer's own calls under its lock, or inside the C encoder: it takes no
lock, calls nothing of the tracer's, reads the wall clock itself and only
appends to a bounded deque, which the timeline drains under the tracer's
lock when the trace is flushed.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections import deque
from typing import Any, NamedTuple

__all__ = ["MIN_PAUSE_NS", "DriverGC", "GcPause"]

#: Collections shorter than this are counted, not drawn (a young collection
#: takes a few µs; 1 ms is a pause a dispatch loop's wave can feel).
MIN_PAUSE_NS = 1_000_000
#: Pauses kept between two drains; beyond that the oldest are dropped (and
#: counted: :attr:`DriverGC.dropped`). A drain happens at least every second.
MAX_KEPT = 4096


class GcPause(NamedTuple):
    """One collection that took at least ``min_pause_ns``, on the wall clock (ns)."""

    start_ns: int
    end_ns: int
    generation: int
    collected: int
    uncollectable: int
    #: The name of the thread whose allocation set it off.
    thread: str


class DriverGC:
    """Records this process's collections while started: totals, and the long ones.

    One per traced run: two runs in one driver each record every collection
    of the process while they are open (a pause stops both their loops).
    """

    def __init__(self, min_pause_ns: int = MIN_PAUSE_NS, max_kept: int = MAX_KEPT) -> None:
        for name, value, least in (("min_pause_ns", min_pause_ns, 0), ("max_kept", max_kept, 1)):
            if value.__class__ is bool or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        self.min_pause_ns = min_pause_ns
        self._pauses: deque[GcPause] = deque(maxlen=max_kept)
        #: Every collection since :meth:`start`, however short, and their time in all.
        self.collections = 0
        self.total_ns = 0
        self.longest_ns = 0
        #: Long pauses dropped before a drain took them (more than ``max_kept`` between two).
        self.dropped = 0
        self._start_perf = 0  # the collection under way: its start, monotonic (0: none)
        self._started = False

    def start(self) -> None:
        """Begin recording (idempotent)."""
        if not self._started:
            self._started = True
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        """Stop recording (idempotent); what was recorded stays to be taken."""
        if self._started:
            self._started = False
            with contextlib.suppress(ValueError):  # someone cleared gc.callbacks
                gc.callbacks.remove(self._callback)
            self._start_perf = 0

    def take(self) -> list[GcPause]:
        """The long pauses recorded since the last take, oldest first."""
        pauses = self._pauses
        out: list[GcPause] = []
        while pauses:  # popleft, not a copy and clear: the callback may append meanwhile
            out.append(pauses.popleft())
        return out

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Runs twice per collection, young ones included: the start only reads a clock.
        # Never raises: an exception here would be printed by Python at every collection.
        try:
            if phase == "start":
                self._start_perf = _perf_ns()
                return
            begun = self._start_perf
            if not begun:  # started recording mid-collection
                return
            self._start_perf = 0
            dur = _perf_ns() - begun
            self.collections += 1
            self.total_ns += dur
            if dur > self.longest_ns:
                self.longest_ns = dur
            if dur >= self.min_pause_ns:
                pauses = self._pauses
                if len(pauses) == pauses.maxlen:
                    self.dropped += 1
                end = time.time_ns()  # the trace's clock: the wall clock, as every node's
                pauses.append(GcPause(
                    end - dur, end, int(info.get("generation", -1)),
                    int(info.get("collected", 0)), int(info.get("uncollectable", 0)),
                    threading.current_thread().name,
                ))
        except Exception:  # pragma: no cover - a dict or a clock gone strange, a shutdown
            self._start_perf = 0


_perf_ns = time.perf_counter_ns

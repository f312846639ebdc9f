"""The driver's Python GC pauses, under the dispatch loop.

A collection holds the GIL, so the dispatch loop stood still meanwhile,
whichever thread set it off: pauses of 1 ms or more (recorded by
:mod:`tracer.ray.driver_gc`) are drawn at each flush on a track of their
own under the loop (a pause may begin inside one of the loop's slices and
end after it in the same microsecond, which would break their nesting on
one track), and every collection's count and time go on the run's slice.
"""

from __future__ import annotations

import weakref

from tracer.format import TraceWriter, Track
from tracer.ray import layout as L
from tracer.ray.driver_gc import DriverGC

__all__ = ["GCPauses"]


class GCPauses:
    """Records the driver's GC while a run is open and draws its long pauses."""

    def __init__(self, writer: TraceWriter, loop: Track) -> None:
        self.writer = writer
        self._loop = loop
        self._track: Track | None = None  # declared at the first long pause
        self._gc = DriverGC()
        self._gc.start()
        weakref.finalize(self, self._gc.stop)

    def draw(self) -> None:
        """Draw the long pauses recorded since the last call."""
        gc_ = self._gc
        pauses = gc_.take()
        if not pauses:
            return
        w = self.writer
        track = self._track
        if track is None:
            track = self._track = w.track(
                L.DRIVER_GC_TRACK, parent=self._loop, merge=False,
                description="Collections of the driver's Python garbage collector that "
                f"took {gc_.min_pause_ns / 1e6:g} ms or more: it holds the GIL, so the "
                "dispatch loop stood still meanwhile, whichever thread set it off",
            )
        with w.in_time_order():  # late: behind the rest of the trace
            for p in pauses:
                w.complete(
                    track, f"{L.SLICE_GC_PREFIX}{p.generation})", p.start_ns, p.end_ns,
                    category=L.CAT_SCHEDULER,
                    args={L.ARG_GC_GENERATION: p.generation, L.ARG_GC_COLLECTED: p.collected,
                          L.ARG_GC_UNCOLLECTABLE: p.uncollectable, L.ARG_GC_THREAD: p.thread},
                )

    def stop(self) -> None:
        """Stop recording (the drawn pauses stay)."""
        self._gc.stop()

    def totals(self) -> dict[str, int]:
        """The run's GC totals, for its slice's END: recording stops, the last pauses drawn."""
        gc_ = self._gc
        gc_.stop()
        self.draw()
        args = {
            L.ARG_DRIVER_GC_COLLECTIONS: gc_.collections,
            L.ARG_DRIVER_GC_NS: gc_.total_ns,
            L.ARG_DRIVER_GC_LONGEST_NS: gc_.longest_ns,
        }
        if gc_.dropped:
            args[L.ARG_DRIVER_GC_DROPPED] = gc_.dropped
        return args

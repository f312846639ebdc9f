"""The Ray-events channel: Ray's own events of the run's tasks, read in the background.

Ray reports a task's events to the GCS about a second after they happen
(``RAY_task_events_report_interval_ms``), so they are read late: by the
flusher thread at its flushes (never by the dispatch loop), no more often
than every ``MIN_INTERVAL_S`` and never spending more than ~5% of the time
reading (a read that took 50 ms waits a second before the next), and at the
close, which waits for the last ones up to a budget
(``TRACER_RAY_EVENTS_BUDGET_S``, 2 s by default) and then says on the
execution slice how many executions lack them (``ray_events_missing``).
Reading goes through :mod:`tracer.ray.ray_events`; drawing through the run
timeline. ``TRACER_RAY_EVENTS=0`` turns the channel off.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from tracer.ray.ray_events import RayEventSource
from tracer.ray.timeline import RayTaskEvents, RunTimeline

logger = logging.getLogger("tracer")

__all__ = ["ENV_BUDGET", "ENV_SWITCH", "RayEventsChannel"]

ENV_SWITCH = "TRACER_RAY_EVENTS"
ENV_BUDGET = "TRACER_RAY_EVENTS_BUDGET_S"
DEFAULT_BUDGET_S = 2.0
#: Reads at flushes are at least this far apart ...
MIN_INTERVAL_S = 1.0
#: ... and this many times the last read's cost apart (reading <= ~5% of the time).
_COST_FACTOR = 20.0
#: A read waits this long for Ray at most.
_READ_TIMEOUT_S = 2.0
#: At the close, between reads.
_CLOSE_POLL_S = 0.2


def enabled_by_env() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def close_budget_s() -> float:
    """The close's budget for the last events (``$TRACER_RAY_EVENTS_BUDGET_S``)."""
    raw = os.environ.get(ENV_BUDGET, "").strip()
    if raw:
        try:
            return max(0.0, float(raw))
        except ValueError:
            logger.warning("tracer: ignoring %s=%r (not a number of seconds)", ENV_BUDGET, raw)
    return DEFAULT_BUDGET_S


class RayEventsChannel:
    """Reads Ray's events of the executions the timeline drew, and has them drawn."""

    def __init__(
        self, timeline: RunTimeline, lock: threading.RLock, source: RayEventSource
    ) -> None:
        self._timeline = timeline
        self._lock = lock
        self._source = source
        self._next = time.monotonic() + MIN_INTERVAL_S
        self._reading = threading.Lock()  # one read at a time (flusher, close)
        # Set by close() under the tracer's lock: a read still under way then draws nothing.
        self._closed = False
        timeline.expect_ray_events()

    @classmethod
    def start(cls, timeline: RunTimeline, lock: threading.RLock) -> RayEventsChannel | None:
        """A channel for the driver's job, or None (switched off, no Ray)."""
        if not enabled_by_env():
            return None
        source = RayEventSource.for_current_job()
        return None if source is None else cls(timeline, lock, source)

    def poll(self) -> None:
        """At a flush (not under the tracer's lock): read and draw what is due."""
        if time.monotonic() < self._next or not self._reading.acquire(blocking=False):
            return
        try:
            self._read_and_draw(final=False)
        finally:
            self._next = time.monotonic() + max(
                MIN_INTERVAL_S, self._source.last_cost_s * _COST_FACTOR
            )
            self._reading.release()

    def _read_and_draw(self, final: bool) -> bool:
        """One read of what is wanted; True when nothing is wanted any more."""
        with self._lock:
            if self._closed:
                return True
            wanted = self._timeline.ray_events_wanted()
        if not wanted:
            return True
        facts: list[RayTaskEvents] = self._source.read(wanted, _READ_TIMEOUT_S)
        with self._lock:
            if self._closed:
                return True
            self._timeline.ray_events(facts, final=final, dropped_by_ray=self._source.dropped)
            return not self._timeline.ray_events_wanted()

    def close(self, budget_s: float | None = None) -> None:
        """Wait up to the budget for the last events, draw what came, stop reading."""
        budget = close_budget_s() if budget_s is None else budget_s
        deadline = time.monotonic() + budget
        # The caller holds the tracer's lock, and a flusher's read still under way (its
        # join timed out) holds _reading and then waits for that lock: waiting for
        # _reading without a limit would deadlock the run. Past the budget the close
        # goes on without a last read; the late read then draws nothing (_closed).
        got = self._reading.acquire(timeout=max(budget, 0.0))
        try:
            while got:
                last = time.monotonic() + _CLOSE_POLL_S >= deadline
                if self._read_and_draw(final=last) or last:
                    break
                time.sleep(_CLOSE_POLL_S)
        finally:
            self._closed = True
            if got:
                self._reading.release()
            self._source.close()

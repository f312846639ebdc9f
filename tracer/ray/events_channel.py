"""The Ray-events channel: Ray's own events of the run's tasks, read in the background.

Ray reports a task's events to the GCS about a second after they happen
(``RAY_task_events_report_interval_ms``), so they are read late: by the
flusher thread at its flushes (never by the dispatch loop), no more often
than every ``MIN_INTERVAL_S`` and never spending more than ~5% of the time
reading (a read that took 50 ms waits a second before the next), and at the
close (after the run returned, see :mod:`tracer.ray.finishing`), which waits
for the last ones up to a budget (``TRACER_RAY_EVENTS_BUDGET_S``, 2 s by
default); the timeline then says how many executions lack them
(``ray_events_missing``, on the ``Ray's events read`` instant).

A read of the job sends every task Ray holds of it, wanted or not (Ray's
filters cannot say "since"), so reads are rationed by what they would send:
at flushes the job is read only when the tasks wanted are at least three
quarters of it, or half of what Ray keeps (each task is then sent about 1.33
times, however long the run),
and the close, instead of reading the job every 0.2 s until the last events
came, asks for each worker's last execution alone until Ray has them, then
reads the job once. A driver whose job already ran more tasks than a run
wants reads the tasks that finished last instead of the job
(:meth:`~tracer.ray.ray_events.GcsQuery.recent`).

Reading goes through :mod:`tracer.ray.ray_events`; drawing through the run
timeline. ``TRACER_RAY_EVENTS=0`` turns the channel off.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from tracer._env import env_flag, env_seconds
from tracer.ray.connection import ray_connected
from tracer.ray.ray_events import RayEventSource
from tracer.ray.timeline import RayTaskEvents, RunTimeline

logger = logging.getLogger("tracer")

__all__ = [
    "ENV_BUDGET",
    "ENV_EXECUTIONS",
    "ENV_SWITCH",
    "SOURCE_RAY_EVENTS",
    "SOURCE_RETURNS",
    "RayEventsChannel",
    "executions_source",
]

ENV_SWITCH = "TRACER_RAY_EVENTS"
ENV_BUDGET = "TRACER_RAY_EVENTS_BUDGET_S"
#: Where level 1's executions come from: the return channel (the default) or Ray's events.
ENV_EXECUTIONS = "TRACER_EXECUTIONS"
SOURCE_RAY_EVENTS = "ray_events"
SOURCE_RETURNS = "returns"
DEFAULT_BUDGET_S = 2.0
#: Reads at flushes are at least this far apart ...
MIN_INTERVAL_S = 1.0
#: ... and this many times the last read's cost apart (reading <= ~5% of the time).
_COST_FACTOR = 20.0
#: A read waits this long for Ray at most.
_READ_TIMEOUT_S = 2.0
#: At the close, between reads.
_CLOSE_POLL_S = 0.2
#: At flushes, a read of the job happens only when the tasks wanted are at least
#: this share of what it sends (see RayEventSource.worth_reading): each task is
#: then sent about 1 / _READ_SHARE times. At 0.5 a 2000-task run was sent 2.2 times
#: over (~10 µs of the driver's CPU per task sent, about as much again in the GCS).
_READ_SHARE = 0.75
#: Ray's events of at most about this many tasks are drawn in one hold of the tracer's
#: lock (~10 ms; the dispatch loop waits for it meanwhile).
_DRAW_CHUNK = 256
#: A read of at least this many tasks' events is followed by a trim of freed memory
#: (see _release_freed_memory).
_TRIM_AFTER = 2000
#: At the close, one-task queries of at most this many workers' last executions
#: say when Ray has everything (see RayPhases.probes).
_PROBES = 16


def enabled_by_env() -> bool:
    """Are Ray's events read (``$TRACER_RAY_EVENTS``, on by default; see tracer._env)?"""
    return env_flag(ENV_SWITCH, True)


def executions_source() -> str:
    """Where level 1's executions come from (``$TRACER_EXECUTIONS``).

    ``returns`` (the default): each traced task returns its measurements as
    one extra value, read when the runner receives it. Executions are drawn
    at once; the tracer finds failed tasks itself (``tasks_received_as_ready``
    returns them, with the attempts Ray made).

    ``ray_events``: from Ray's own task events, with the RSS in a profile
    event of the task's; no value of ours travels back with the task. On
    2000 no-op tasks that is most of level 1's cost (benchmarks/README.md),
    but executions are drawn a second or more late (the trace's stages end
    once theirs are in: read it after :func:`~tracer.ray.wait_for_traces`),
    a failure is drawn from Ray's events (as Ray's error type) rather than
    returned to the runner, and an execution whose events Ray never sends
    (its caps) is counted missing.
    """
    raw = os.environ.get(ENV_EXECUTIONS, "").strip().lower()
    if raw in ("", SOURCE_RETURNS, "return", "return_channel"):
        return SOURCE_RETURNS
    if raw in (SOURCE_RAY_EVENTS, "ray-events", "events"):
        return SOURCE_RAY_EVENTS
    logger.warning(
        "tracer: ignoring %s=%r (valid: %s, %s)", ENV_EXECUTIONS, raw, SOURCE_RETURNS,
        SOURCE_RAY_EVENTS,
    )
    return SOURCE_RETURNS


def close_budget_s() -> float:
    """The close's budget for the last events (``$TRACER_RAY_EVENTS_BUDGET_S``).

    Not a finite number of 0 or more: a warning and the default (``inf``
    overflowed the lock's timeout, and the close then drew none of Ray's
    events; ``nan`` meant no wait at all).
    """
    return env_seconds(ENV_BUDGET, DEFAULT_BUDGET_S)


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

    @property
    def source_name(self) -> str:
        """Where Ray's events were read last (``layout.ARG_RAY_EVENTS_SOURCE``)."""
        return self._source.read_from or "none"

    def poll(self) -> None:
        """At a flush (not under the tracer's lock): read and draw what is due."""
        if time.monotonic() < self._next or not ray_connected():
            return
        if not self._reading.acquire(blocking=False):
            return
        try:
            self._read_and_draw(final=False, at_flush=True)
        finally:
            self._next = time.monotonic() + max(
                MIN_INTERVAL_S, self._source.last_cost_s * _COST_FACTOR
            )
            self._reading.release()

    def _read_and_draw(self, final: bool, at_flush: bool = False) -> bool:
        """One read of what is wanted; True when nothing is wanted any more.

        Also True once Ray was shut down (see tracer.ray.connection): nothing
        more can come, and what is still wanted is counted missing.
        """
        with self._lock:
            if self._closed or not ray_connected():
                return True
            wanted = self._timeline.ray_events_wanted()
        if not wanted:
            return True
        if at_flush and not self._source.worth_reading(len(wanted), _READ_SHARE):
            return False
        # Past the flushes (the close, once the probes came) Ray should have them all.
        facts = self._source.read(wanted, _READ_TIMEOUT_S, complete=not at_flush)
        many = len(facts) >= _TRIM_AFTER
        done = self._draw(facts, final)
        if many:
            del facts
            _release_freed_memory()
        return done

    def _draw(self, facts: list[RayTaskEvents], final: bool) -> bool:
        """Draw ``facts`` a chunk at a time under the tracer's lock; True when none is wanted.

        Every call of the dispatch loop's takes that lock: one hold for a whole
        read (~40 µs a task) froze the loop for 0.6 s at a read of 14,000
        tasks in a 20k-task run. Between chunks the loop gets its turn.
        """
        dropped = self._source.dropped
        for chunk in _chunks(facts, _DRAW_CHUNK):
            with self._lock:
                if self._closed:
                    return True
                self._timeline.ray_events(chunk, final=final, dropped_by_ray=dropped)
        with self._lock:
            return self._closed or not self._timeline.ray_events_pending()

    def _settled(self) -> bool:
        """Has Ray the events of every worker's last execution still wanted?

        Not drawn here: the read of everything that follows draws them with the
        rest, in time order (drawn first, a worker's last execution took the
        lane of Ray's phases its earlier ones then could not share).
        """
        with self._lock:
            if self._closed or not ray_connected():
                return True
            probes = self._timeline.ray_events_probes(_PROBES)
        if not probes:
            return True
        facts = self._source.read_each(probes, _READ_TIMEOUT_S)
        with self._lock:
            return self._closed or self._timeline.ray_events_complete(facts, probes)

    def stop(self) -> None:
        """No more reads, none now (tracing stopped after an error): a read under way
        draws nothing, and the source's connection goes."""
        self._closed = True
        self._source.close()

    def close(self, budget_s: float | None = None) -> None:
        """Wait up to the budget for the last events, draw what came, stop reading."""
        budget = close_budget_s() if budget_s is None else budget_s
        deadline = time.monotonic() + budget
        # A flusher's read still under way (its join timed out) holds _reading; a caller
        # holding the tracer's lock (which that read then waits for) would deadlock
        # waiting for _reading without a limit. Past the budget the close goes on
        # without a last read; the late read then draws nothing (_closed).
        got = self._reading.acquire(timeout=max(budget, 0.0))
        try:
            # Reading everything wanted costs what the job holds, every time; asking for
            # the few probes costs little: everything is read once they have come.
            while got:
                last = time.monotonic() + _CLOSE_POLL_S >= deadline
                if last:
                    self._read_and_draw(final=True)
                    break
                if self._settled() and self._read_and_draw(final=False):
                    break
                time.sleep(_CLOSE_POLL_S)
        finally:
            self._closed = True
            if got:
                self._reading.release()
            self._source.close()


def _release_freed_memory() -> bool:
    """Give the memory a big read freed back to the system (glibc's ``malloc_trim``).

    A read of thousands of tasks' events allocates and frees tens of MB in
    the reading thread; glibc keeps what was freed, in that thread's arena,
    for the process's life: a 20k-task run's driver held ~50 MB more after
    its run (the peak was also lower, the next read reusing less of it).
    Trimming costs ~5-30 ms of this thread's CPU, with the GIL released but
    each malloc arena locked while it is trimmed (a dispatch loop allocating
    meanwhile waits that long at most, as it does for a chunk's drawing), so
    it follows only reads of :data:`_TRIM_AFTER` tasks or more: a few a run.
    False where there is no glibc.
    """
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim  # releases the GIL meanwhile
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM is False:
        return False
    try:
        _MALLOC_TRIM(0)
    except Exception:
        return False
    return True


#: glibc's malloc_trim once looked up (False: none here).
_MALLOC_TRIM: Any = None


def _chunks(facts: list[RayTaskEvents], size: int) -> Iterator[list[RayTaskEvents]]:
    """``facts`` in time order, cut into chunks of about ``size``; a task's attempts
    stay together (an awaited task settles on all of its attempts at once)."""
    if len(facts) <= size:
        yield facts
        return
    # Each task in the order of its first attempt's start, its attempts after it in
    # theirs (the sorts are stable). A number per task, not a list of its attempts:
    # a dict of strings and ints is not the cycle collector's to walk, and a read's
    # thousands of lists were carried into its oldest generation (see
    # ray_events_wire.RawTaskEvents for what that costs).
    ordered = sorted(facts, key=_start)
    rank: dict[str, int] = {}
    for fact in ordered:
        rank.setdefault(fact.ray_task_id, len(rank))
    ordered.sort(key=lambda fact: rank[fact.ray_task_id])
    chunk: list[RayTaskEvents] = []
    for i, fact in enumerate(ordered):
        chunk.append(fact)
        if len(chunk) >= size and (
            i + 1 == len(ordered) or ordered[i + 1].ray_task_id != fact.ray_task_id
        ):
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _start(fact: RayTaskEvents) -> int:
    return fact.span[0] if fact.span else 0

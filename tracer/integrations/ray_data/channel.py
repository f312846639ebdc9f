"""Driver side of the measurements' way back: the job's metrics actor, drained without waiting.

One actor per Ray job (``tracer.ray.metrics_actor``, named after the job),
shared by every traced Ray Data execution of the driver: an actor is a
worker process (~1-2 s of CPU to start), which a pipeline of a few seconds
should pay once, not per execution. It is created once an execution's
trace is open (a run whose trace cannot be created gets none) and stays
(idle, 0 CPUs) until the job ends or :meth:`MeasurementChannel.stop`
(``disable()``) removes it. Each
measurement (workers send them in batches) names its operator's token;
executions register their operators' tokens with a *sink* (a function that
queues what it is given), and :meth:`MeasurementChannel.poll` routes what
the actor held to them.

The scheduling loop never waits for the actor: :meth:`poll` sends a
``drain`` at most every :data:`DRAIN_INTERVAL_S` and picks its answer up on
a later call once it is there. Only an execution's close waits, up to
:data:`CLOSE_GRACE_S` (:data:`START_GRACE_S` while the actor's process is
still starting), for measurements known to be on their way. After its
first failure the actor is not called again (the executions then record
their tasks' measurements as lost).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tracer.ray.connection import RAY_SHUT_DOWN, ray_connected
from tracer.ray.task_metrics import Metrics

__all__ = ["CLOSE_GRACE_S", "DRAIN_INTERVAL_S", "START_GRACE_S", "MeasurementChannel", "channel"]

logger = logging.getLogger("tracer")

#: How often the scheduling loop asks the actor for what it holds.
DRAIN_INTERVAL_S = 0.2
#: The scheduling loop's polls look at most this often.
_CHECK_INTERVAL_S = 0.05
#: At an execution's close: how long to wait for measurements still on their way...
CLOSE_GRACE_S = 2.0
#: ... or, while the actor has never answered (its process starting), for it to start.
START_GRACE_S = 15.0
#: How long one answer of the actor may take (its start included: ~1-2 s) before
#: the channel gives up on it.
ACTOR_TIMEOUT_S = 30.0

Sink = Callable[[list[Metrics]], None]


class MeasurementChannel:
    """The job's metrics actor as this driver process sees it (one per process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._session: str | None = None
        self._actor: Any = None
        self._key = ""
        self._pending: Any = None  # the ref of a drain sent and not yet answered
        self._sent = 0.0  # when it was sent (time.monotonic)
        self._checked = 0.0  # when poll last looked
        self._generation = 0  # actors removed by stop(), for a new key each time
        self._sinks: dict[str, Sink] = {}
        self.failed: str | None = None
        #: The actor answered once: it is up.
        self.answered = False

    def key(self) -> str:
        """The key of this job's actor, which workers send to (:meth:`start` creates it).

        Given to an operator's tasks as it starts, before the execution's trace
        is opened: a run whose trace cannot be created gets no actor.
        """
        failed_actor = None
        with self._lock:
            if self.failed is not None and self._actor is not None and not self._sinks:
                # The actor failed (Ray's OOM killer killed it, say), and no execution uses
                # it now: the next one gets a new actor, under a new key. A failed actor
                # was kept for the process's life, and every later execution lost its
                # measurements (fresh user's review 7).
                failed_actor, self._actor, self._pending = self._actor, None, None
                self._generation += 1
            key = self._current()[0]
        if failed_actor is not None and ray_connected():
            with contextlib.suppress(Exception):
                import ray

                ray.kill(failed_actor)
        return key

    def start(self) -> None:
        """Create this job's actor, unless it is up (a traced execution is about to run)."""
        from tracer.ray.metrics_actor import create_metrics_actor

        with self._lock:
            key, session = self._current()
            if self._actor is None or self._session != session or self._key != key:
                # A new job or a new cluster (tests restart Ray): a new actor.
                self._actor = create_metrics_actor(key)
                self._session, self._key = session, key
                self._pending, self.failed, self.answered = None, None, False

    def _current(self) -> tuple[str, str]:
        """(this job's key, the Ray session): a new key for each actor, since workers
        keep the handle they found for a key."""
        import ray

        from tracer.ray.output import ray_session_dir

        job = ray.get_runtime_context().get_job_id()
        return f"raydata-{job}-{self._generation}", str(ray_session_dir())

    def stop(self) -> bool:
        """Remove the job's actor, unless an execution still uses it; whether it was removed."""
        with self._lock:
            if self._actor is None or self._sinks:
                return False
            actor, self._actor, self._pending = self._actor, None, None
            self._session = None
            self._generation += 1
        if ray_connected():  # after ray.shutdown(), ray.kill would start a new cluster
            with contextlib.suppress(Exception):
                import ray

                ray.kill(actor)
        return True

    def not_started(self) -> None:
        """An execution whose operators were given :meth:`key` runs untraced after all.

        With no actor up, the next actor gets a new key: a worker that looked
        this one's actor up in vain keeps that answer (the untraced run's tasks
        that had their transformer already: actor pools, and before Ray 2.54
        every map operator's, sent as it starts).
        """
        with self._lock:
            if self._actor is None and not self._sinks:
                self._generation += 1

    def register(self, token: str, sink: Sink) -> None:
        with self._lock:
            self._sinks[token] = sink

    def unregister(self, token: str) -> None:
        with self._lock:
            self._sinks.pop(token, None)

    def poll(self, wait: float = 0.0) -> bool:
        """Route what the actor sent back; ask again if due. ``wait``: for an answer, in s.

        Returns whether an answer was routed. Never raises.
        """
        now = time.monotonic()
        if wait <= 0 and now - self._checked < _CHECK_INTERVAL_S:
            return False  # the scheduling loop's steps: look at most every few ms
        self._checked = now
        import ray

        items: list[Any] | None = None
        with self._lock:
            actor = self._actor
            if actor is None or self.failed is not None:
                return False
            if not ray_connected():  # Ray's calls would start a new cluster to answer
                self.failed = RAY_SHUT_DOWN
                self._pending = None
                return False
            now = time.monotonic()
            try:
                if self._pending is None and (wait > 0 or now - self._sent >= DRAIN_INTERVAL_S):
                    self._pending, self._sent = actor.drain.remote(), now
                if self._pending is not None:
                    ready, _ = ray.wait([self._pending], timeout=wait)
                    if ready:
                        ref, self._pending = self._pending, None
                        items = list(ray.get(ref, timeout=ACTOR_TIMEOUT_S))
                        self.answered = True
                    elif now - self._sent > ACTOR_TIMEOUT_S:
                        raise TimeoutError(f"no answer in {ACTOR_TIMEOUT_S:.0f} s")
            except Exception as exc:
                self.failed = f"metrics actor failed: {type(exc).__name__}: {exc}"[:300]
                self._pending = None
                logger.warning("tracer: Ray Data measurements stopped (%s)", self.failed)
                return False
            sinks = dict(self._sinks)
        if not items:
            return items is not None
        by_op: dict[str, list[Metrics]] = {}
        for batch in items:  # each a worker's batch (a list), or one measurement
            for item in batch if isinstance(batch, list) else (batch,):
                if isinstance(item, dict):
                    by_op.setdefault(str(item.get("op")), []).append(item)
        for token, batch in by_op.items():
            sink = sinks.get(token)
            if sink is not None:  # else: an execution already closed
                with contextlib.suppress(Exception):
                    sink(batch)
        return True


_CHANNEL: MeasurementChannel | None = None
_CHANNEL_LOCK = threading.Lock()


def channel() -> MeasurementChannel:
    """This driver process's channel."""
    global _CHANNEL
    with _CHANNEL_LOCK:
        if _CHANNEL is None:
            _CHANNEL = MeasurementChannel()
        return _CHANNEL

"""The metrics actor: how tasks that measure themselves reach the driver (Daft's design).

Used only by tasks that call :func:`tracer.ray.collect_ray_task_metrics`
themselves; traced remote functions return their measurements instead (see
:mod:`tracer.ray.task_metrics` for why). One actor per execution, named after
it, holds measurements until the driver drains them at the end of each wave.
Every call has a timeout on the driver side; a dead actor loses measurements,
never the run: the driver stops calling it after its first failure and
records which tasks' measurements were lost with it. Tasks never wait on it:
their calls are fire-and-forget, and a worker that cannot find the actor
stops looking for it. The driver's side (draining, losses) is
:mod:`tracer.ray.actor_channel`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

import ray

NAMESPACE = "tracer"
#: Per worker process: each execution's actor handle, or None when it was not
#: found (looked up once per execution: a name lookup is a GCS round trip).
_ACTORS: dict[str, Any] = {}
_MAX_ACTORS = 1024  # a long-lived worker serves many executions: forget old ones
_LOCK = threading.Lock()


def actor_name(execution_id: str) -> str:
    return f"tracer-metrics-{execution_id}"


@ray.remote(num_cpus=0, max_concurrency=1)
class MetricsActor:
    """Buffers task measurements of one execution until the driver drains them."""

    def __init__(self) -> None:
        self._items: list[dict[str, Any]] = []

    def put(self, metrics: dict[str, Any]) -> None:
        self._items.append(metrics)

    def drain(self) -> list[dict[str, Any]]:
        items, self._items = self._items, []
        return items

    def ready(self) -> bool:
        return True

    def pid(self) -> int:
        """The actor's process id (for tests that make it fail)."""
        return os.getpid()


def create_metrics_actor(execution_id: str) -> Any:
    """Create (driver side) the execution's metrics actor; returns without waiting for it.

    Its name is registered before this returns, so tasks find it at once and
    their calls queue until it is up; its process takes ~1-2 s to start,
    which the run does not wait for (the driver drains it only once it is
    ready, see :meth:`MetricsActor.ready`).
    """
    return MetricsActor.options(  # type: ignore[attr-defined]
        name=actor_name(execution_id), namespace=NAMESPACE, get_if_exists=True
    ).remote()


def _actor(execution_id: str) -> Any:
    """The execution's actor handle in this worker process, or None (looked up once)."""
    with _LOCK:
        if execution_id in _ACTORS:
            return _ACTORS[execution_id]
        try:
            actor = ray.get_actor(actor_name(execution_id), namespace=NAMESPACE)
        except Exception:  # no such actor (never started, or dead): do not ask again
            actor = None
        if len(_ACTORS) >= _MAX_ACTORS:
            _ACTORS.clear()
        _ACTORS[execution_id] = actor
        return actor


def metrics_actor_exists(execution_id: str) -> bool:
    """Whether the driver started a metrics actor for the execution: it traces it.

    How a task that measures itself learns that its driver traces when the
    level was given to :func:`tracer.ray.ray_tracer` as an argument, which
    workers do not see. One name lookup per worker process and execution.
    """
    return _actor(execution_id) is not None


def send_to_metrics_actor(execution_id: str, metrics: dict[str, Any]) -> None:
    """Fire-and-forget from a task; silently drops the measurement when no actor exists."""
    actor = _actor(execution_id)
    if actor is None:
        return
    with contextlib.suppress(Exception):
        actor.put.remote(metrics)

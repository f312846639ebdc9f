"""Whether this driver is still connected to Ray: once it is not, the tracer asks Ray nothing.

A runner (or a signal handler) may call ``ray.shutdown()`` while a tracer
is open, and close it afterwards. Ray's ``get``, ``wait``, ``kill``,
``get_runtime_context`` and an actor's calls then start a new local
cluster (Ray's auto-init): the close took ~10 s, and left the program with
a Ray it never asked for, so that its own next ``ray.init`` failed. So
every call the tracer makes to Ray after its start (the measurements'
fetch, the metrics actor, Ray's task events, the actor's removal) asks
this first; what it would have fetched is recorded as lost instead.
"""

from __future__ import annotations

__all__ = ["RAY_SHUT_DOWN", "ray_connected"]

#: Why measurements not read by then are lost (the reason of the trace's lost instants).
RAY_SHUT_DOWN = "Ray was shut down"


def ray_connected() -> bool:
    """Is Ray initialised in this process (``ray.is_initialized()``, ~0.1 µs)?"""
    try:
        import ray

        return bool(ray.is_initialized())
    except Exception:
        return False

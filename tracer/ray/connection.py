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

__all__ = ["RAY_SHUT_DOWN", "ray_connected", "stop_asking_ray"]

#: Why measurements not read by then are lost (the reason of the trace's lost instants).
RAY_SHUT_DOWN = "Ray was shut down"

#: Ray is about to be shut down (:func:`stop_asking_ray`): ask it nothing more.
_going_down = False


def stop_asking_ray(going_down: bool) -> None:
    """From now on (True) the tracer's threads ask Ray nothing, as if it were shut down,
    until False: what ``ray.shutdown()`` says before it goes on with traces still being
    finished (:mod:`tracer.ray.finishing`). A thread still inside one of Ray's calls
    when Ray's core worker shuts down gets Ray's "core worker has already been shutdown"
    and the process exits (a driver that ran ~150 traced runs back to back, then shut
    Ray down)."""
    global _going_down
    _going_down = bool(going_down)


def ray_connected() -> bool:
    """Is Ray initialised in this process (``ray.is_initialized()``, ~0.1 µs), and not
    about to be shut down?"""
    if _going_down:
        return False
    try:
        import ray

        return bool(ray.is_initialized())
    except Exception:
        return False

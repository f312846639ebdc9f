"""Traces finished after their run returned: Ray's last events come a second late.

Ray reports a task's events about a second after it ends
(``RAY_task_events_report_interval_ms``), so the last tasks' events come
after the run's last task. Waiting for them in the close made every run
return that much later: +0.2-1 s, whatever the run's length (a quarter of a
2000-task run of no-op tasks, in wall time, and the CPU that Ray's idle
processes spend meanwhile). So the close writes everything else (the
run's slice ends when the run did), and a thread of its own waits for Ray's
last events (up to the budget, ``TRACER_RAY_EVENTS_BUDGET_S``), draws them,
writes the counts of what is missing (the ``Ray's events read`` instant)
and closes the file.

Until then the trace file is a complete, valid trace without those last
events. :func:`wait_for_traces` waits for them
(``tracer.query`` and ``tracer summary`` call it for the trace they open in
the same process), and the interpreter waits for them at exit, and so does
``ray.shutdown()``: after it Ray can be asked nothing (see
:mod:`tracer.ray.connection`), and a script that shuts Ray down right after
its run would lose Ray's events of the run's last second.
``TRACER_RAY_EVENTS_WAIT=1`` makes the close wait itself, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tracer._env import env_flag
from tracer.ray.connection import stop_asking_ray

if TYPE_CHECKING:
    from tracer.format import TraceWriter
    from tracer.ray.events_channel import RayEventsChannel
    from tracer.ray.timeline import RunTimeline

logger = logging.getLogger("tracer")

__all__ = [
    "ENV_WAIT",
    "MAX_FINISHING",
    "close_waits",
    "finish_in_background",
    "finish_trace",
    "wait_for_traces",
]

ENV_WAIT = "TRACER_RAY_EVENTS_WAIT"

_lock = threading.Lock()
_pending: dict[Path, threading.Thread] = {}  # in the order they were started
#: Traces finished in the background at once, at most: a driver that runs short runs back
#: to back (a query service) started one thread per run faster than they ended, each
#: reading Ray's events beside the others (67 at once, 126 file descriptors, 348 MiB,
#: each finished a median 6 s late). A close that finds this many waits for the oldest:
#: what it costs that run is what the closes would have waited without the threads.
MAX_FINISHING = 4
_atexit_registered = False
#: ``ray.shutdown`` waits at most this long for the traces being finished, over the budget.
_SHUTDOWN_GRACE_S = 5.0


def close_waits() -> bool:
    """Does the close wait for Ray's last events itself (``$TRACER_RAY_EVENTS_WAIT``, off
    by default; see tracer._env)?"""
    return env_flag(ENV_WAIT, False)


def _key(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.abspath(os.fspath(path)))


def finish_in_background(path: str | os.PathLike[str], finish: Callable[[], None]) -> None:
    """Run ``finish`` (which completes the trace at ``path``) in a thread of its own."""
    global _atexit_registered
    key = _key(path)

    def run() -> None:
        try:
            finish()
        except Exception as exc:  # tracing never breaks the job, nor the interpreter's exit
            logger.warning("tracer: finishing the trace %s failed: %s", key, exc)
        finally:
            with _lock:
                if _pending.get(key) is threading.current_thread():
                    del _pending[key]

    with _lock:
        earlier = _pending.get(key)
    if earlier is not None:  # the same file traced again: the earlier run's finish first
        earlier.join()
    _wait_for_room()
    thread = threading.Thread(target=run, name=f"tracer-finish-{key.name}", daemon=True)
    with _lock:
        _pending[key] = thread
        thread.start()
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True
            _wait_at_ray_shutdown()


def _wait_for_room() -> None:
    """Wait until fewer than :data:`MAX_FINISHING` traces are being finished (the oldest
    first; each is bounded by its budget for Ray's events and a read's timeout)."""
    while True:
        with _lock:
            if len(_pending) < MAX_FINISHING:
                return
            oldest = next(iter(_pending.values()))
        logger.debug("tracer: %d traces are being finished; waiting for the oldest", MAX_FINISHING)
        oldest.join()
        with _lock:  # a thread that died without its finally (never: but not forever)
            for key, thread in list(_pending.items()):
                if thread is oldest and not thread.is_alive():
                    del _pending[key]


def _wait_at_ray_shutdown() -> None:
    """Make ``ray.shutdown()`` finish the traces being finished first (bounded).

    Wrapped once per process, on the first trace finished in the background:
    ``ray.shutdown`` (the name users call) waits for :func:`wait_for_traces`
    up to the budget for Ray's events and :data:`_SHUTDOWN_GRACE_S`, then
    shuts Ray down as ever; with no trace being finished it costs a lock.
    """
    try:
        import ray

        original = ray.shutdown
        if getattr(original, "__tracer_waits__", False):
            return

        @functools.wraps(original)
        def shutdown(*args: object, **kwargs: object) -> object:
            with contextlib.suppress(Exception):  # never in the way of Ray's shutdown
                finish_before_ray_goes()
            try:
                return original(*args, **kwargs)
            finally:
                stop_asking_ray(False)  # a later ray.init is asked as ever

        shutdown.__tracer_waits__ = True  # type: ignore[attr-defined]
        ray.shutdown = shutdown
    except Exception as exc:  # tracing never breaks the job
        logger.debug("tracer: ray.shutdown() will not wait for traces: %s", exc)


def finish_before_ray_goes() -> bool:
    """Before Ray is shut down (or the interpreter exits): the traces being finished get
    their budget for Ray's last events; those still at it then are told to ask Ray
    nothing more (:func:`~tracer.ray.connection.stop_asking_ray`: they write what they
    have) and get :data:`_SHUTDOWN_GRACE_S` to leave the call they are in, so that none
    is inside one of Ray's calls as Ray's core worker goes. True when all are done.

    Bounded either way: back-to-back runs left dozens of traces being finished, and
    the wait at exit, which had no bound, took 24 s."""
    from tracer.ray.events_channel import close_budget_s

    if wait_for_traces(timeout=close_budget_s()):
        return True
    stop_asking_ray(True)
    return wait_for_traces(timeout=_SHUTDOWN_GRACE_S)


def _at_exit() -> None:
    with contextlib.suppress(Exception):  # never in the way of the interpreter's exit
        finish_before_ray_goes()


def finish_trace(
    writer: TraceWriter,
    lock: threading.RLock,
    timeline: RunTimeline,
    channel: RayEventsChannel | None,
    end_ts: int,
    *,
    wait: bool | None = None,
) -> None:
    """Finish a trace whose run ended at ``end_ts``: Ray's last events, then the file.

    Everything else is written already (the run's slice ends at ``end_ts``).
    Unless ``wait`` (default: ``$TRACER_RAY_EVENTS_WAIT``, off), or nothing
    waits for Ray's events, the file is flushed (a complete, valid trace but
    for those) and a thread of its own waits for them (the channel's budget),
    draws them, writes the ``Ray's events read`` instant and closes the
    file; the caller goes on at once.
    """

    def finish() -> None:
        if channel is not None:
            try:
                channel.close()
            except Exception as exc:
                logger.debug("tracer: reading Ray's task events failed: %s", exc)
        try:
            with lock:
                timeline.ray_events_read(
                    end_ts, channel.source_name if channel is not None else None
                )
        except Exception as exc:  # tracing never breaks the job
            logger.warning("tracer: ending the trace %s failed: %s", writer.path, exc)
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    if wait is None:
        wait = close_waits()
    if wait or channel is None or not timeline.ray_events_pending():
        finish()
        return
    try:  # the trace on disk is complete now, but for Ray's last events
        writer.flush()
    except Exception as exc:
        logger.warning("tracer: writing the trace %s failed: %s", writer.path, exc)
    finish_in_background(writer.path, finish)


def wait_for_traces(
    path: str | os.PathLike[str] | None = None, timeout: float | None = None
) -> bool:
    """Wait until the trace at ``path`` (every trace, if None) is finished.

    Returns False if ``timeout`` (seconds) passed first. Each trace takes at
    most its budget for Ray's events (``TRACER_RAY_EVENTS_BUDGET_S``, 2 s by
    default) and a read's timeout after its run returned.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _lock:
            if path is None:
                threads = list(_pending.values())
            else:
                one = _pending.get(_key(path))
                threads = [one] if one is not None else []
        if not threads:
            return True
        for thread in threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
            if thread.is_alive():
                return False

"""Writing the trace out from a thread of its own, so the dispatch loop never waits for a disk.

In a Ray driver every system call is a chance for another thread to take
the GIL, and the loop would pay for that at every wave. So the loop only
sets a flag when a wave ends (waking a thread would cost it a system call
per wave); the flusher looks every 20 ms and writes what the waves since
added in one go, and at least every second. A killed driver loses at most
that: the file is a valid trace at every instant.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Flusher"]

FLUSH_INTERVAL_S = 1.0
MIN_FLUSH_GAP_S = 0.02
#: How long a stop with ``join`` waits for a flush under way (a read of Ray's events
#: can outlast it: the close then goes on without it, see tracer.ray.finishing).
JOIN_TIMEOUT_S = 5.0


class Flusher:
    """Calls ``flush`` within 20 ms of a wave's end (:attr:`wave_ended`), and every second."""

    def __init__(self, flush: Callable[[], None], name: str) -> None:
        self._flush = flush
        #: Set by the dispatch loop when a wave ends: no lock, no system call.
        self.wave_ended = False
        #: When the trace was last written (``time.monotonic``), set by ``flush``.
        self.last_flush = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(MIN_FLUSH_GAP_S):
            due = time.monotonic() - self.last_flush >= FLUSH_INTERVAL_S
            if self.wave_ended or due:
                self.wave_ended = False
                self._flush()

    def stop(self, join: bool = False) -> None:
        """No more flushes; ``join``: wait (up to :data:`JOIN_TIMEOUT_S`) for one under way."""
        self._stop.set()
        if join and self._thread is not threading.current_thread():
            self._thread.join(timeout=JOIN_TIMEOUT_S)

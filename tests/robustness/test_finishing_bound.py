"""Traces finished in the background are bounded: back-to-back runs wait, never pile up.

A driver that runs short runs back to back (a query service) started a
thread per trace being finished faster than they ended: 67 at once, each
reading Ray's events beside the others, 348 MiB, each finished a median 6 s
late. Ray-free: what the bound does is the same whatever a finish does.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tracer.ray import finishing


def test_no_more_than_max_finishing_at_once_and_none_lost(tmp_path: Path) -> None:
    lock = threading.Lock()
    running = 0
    most = 0
    done: list[int] = []

    def finish_of(i: int):  # type: ignore[no-untyped-def]
        def finish() -> None:
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
            time.sleep(0.15)
            with lock:
                running -= 1
                done.append(i)
            if i % 5 == 0:
                raise RuntimeError("a finish that fails frees its place too")
        return finish

    runs = 3 * finishing.MAX_FINISHING
    start = time.monotonic()
    for i in range(runs):
        finishing.finish_in_background(tmp_path / f"run-{i}.perfetto-trace", finish_of(i))
        names = [t.name for t in threading.enumerate() if t.name.startswith("tracer-finish-")]
        assert len(names) <= finishing.MAX_FINISHING, names
    # The closes beyond the bound waited for the oldest: the loop took at least that long.
    assert time.monotonic() - start >= 0.15 * (runs // finishing.MAX_FINISHING - 1)
    assert finishing.wait_for_traces(timeout=30)
    assert most <= finishing.MAX_FINISHING
    assert sorted(done) == list(range(runs))  # every trace finished, none dropped

"""Drawing Ray's events of a read: a chunk at a time under the tracer's lock, nothing lost.

Every call of the dispatch loop takes the tracer's lock. Ray's events of a
whole read drawn in one hold of it (~40 µs a task) froze a 20k-task run's
loop for 0.6 s; drawn in chunks, the loop waits ~10 ms at most.
"""

from __future__ import annotations

import os
import platform
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tracer.format import TraceWriter, read_trace
from tracer.ray import ResourceRequest
from tracer.ray import layout as L
from tracer.ray.events_channel import (
    _DRAW_CHUNK,
    RayEventsChannel,
    _chunks,
    _release_freed_memory,
)
from tracer.ray.timeline import RayTaskEvents, RunTimeline, TimelineTask

T0 = 1_800_000_000_000_000_000
US = 1_000


class _CountingLock:
    """The tracer's RLock, counting its holds."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.holds = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self.holds += 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _Source:
    """What the channel asks of its source while drawing."""

    dropped = 0


def _facts(n: int, workers: int) -> list[RayTaskEvents]:
    """Ray's events of ``n`` executions, complete, given in reverse time order."""
    facts = []
    for i in range(n):
        start = T0 + (10 + 3 * i) * US
        facts.append(RayTaskEvents(
            f"{i:048x}", 0, "map_fn", "n" * 40, 500 + i % workers,
            states=((L.STATE_SUBMITTED, start - US), (L.STATE_RUNNING, start),
                    (L.STATE_FINISHED, start + 2 * US)),
            span=(start, start + 2 * US),
            phases=((L.PHASE_EXECUTE, start, start + 2 * US),),
        ))
    return facts[::-1]


def test_a_big_read_is_drawn_in_chunks_each_in_its_own_hold_of_the_lock(
    tmp_path: Path,
) -> None:
    n = 3 * _DRAW_CHUNK + 17
    path = tmp_path / "chunks.perfetto-trace"
    lock = _CountingLock()
    drawn: list[int] = []
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="chunks", loop_pid=77, loop_tid=77)
        channel = RayEventsChannel(tl, lock, _Source())  # type: ignore[arg-type]
        request = ResourceRequest(num_cpus=1)
        for i in range(n):
            start = T0 + (10 + 3 * i) * US
            task = tl.task_created(TimelineTask, f"t{i}", 0, request, start - 8 * US,
                                   stage_name="map")
            tl.task_dispatched(task, start - 7 * US)
            tl.execution({"start_ns": start, "end_ns": start + 2 * US, "node_id": "n" * 40,
                          "pid": 500 + i % 4, "ray_task_id": f"{i:048x}"}, task)
            tl.task_ended(task, start + 3 * US, None)
        draw = tl.ray_events

        def counted(events: list[RayTaskEvents], **kwargs: Any) -> int:
            drawn.append(len(events))
            return draw(events, **kwargs)

        tl.ray_events = counted  # type: ignore[method-assign]
        assert len(tl.ray_events_wanted()) == n
        assert channel._draw(_facts(n, 4), final=False)  # nothing is wanted any more
        tl.close()

    assert sum(drawn) == n and len(drawn) == 4
    assert max(drawn) <= _DRAW_CHUNK + 1  # a task's attempts may overrun a chunk by a few
    assert lock.holds == len(drawn) + 1  # and one to see what is still wanted
    model = read_trace(path, strict=True)
    spans = [s for s in model.slices if (s.name or "").startswith(L.RAY_TASK_PREFIX)]
    assert len(spans) == n
    assert {s.args[L.ARG_TASK_ID] for s in spans} == {f"t{i}" for i in range(n)}


def test_a_small_read_is_drawn_in_one_hold() -> None:
    facts = _facts(_DRAW_CHUNK, 2)
    assert list(_chunks(facts, _DRAW_CHUNK)) == [facts]


def test_chunks_are_in_time_order_and_keep_a_tasks_attempts_together() -> None:
    facts = _facts(50, 3)
    # Task 7's second attempt ran last of all; its first, early.
    retry = RayTaskEvents(f"{7:048x}", 1, "map_fn", "n" * 40, 501,
                          span=(T0 + 10_000 * US, T0 + 10_002 * US))
    chunks = list(_chunks([retry, *facts], 8))
    assert sum(len(c) for c in chunks) == 51
    assert all(len(c) in (8, 9) for c in chunks[:-1])
    flat = [f for c in chunks for f in c]
    (holding,) = [c for c in chunks if any(f.ray_task_id == retry.ray_task_id for f in c)]
    assert [f.attempt for f in holding if f.ray_task_id == retry.ray_task_id] == [0, 1]
    firsts = [f.span[0] for f in flat if f.attempt == 0 and f.span is not None]
    assert firsts == sorted(firsts)


def _rss_mib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="malloc_trim is glibc's",
)
def test_memory_freed_amid_what_is_kept_is_given_back() -> None:
    """What a big read frees among what it keeps (facts drawn, a few objects still
    alive) stays in glibc's heap, counted in the driver's RSS, until trimmed."""
    blocks = [bytes(4000) for _ in range(50_000)]  # ~200 MB of malloc's heap
    kept = blocks[::50]
    del blocks
    before = _rss_mib()
    assert _release_freed_memory()
    assert _rss_mib() < before - 100, "the freed memory stayed resident"
    assert len(kept) == 1000

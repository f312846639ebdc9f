"""A small runner trace written by hand, following tracer.ray.layout, with known answers.

It has what real runs rarely show: a retried task (one task_id, two attempts,
the first superseded), a task killed by Ray's OOM killer (no execution), a
task left unfinished, overlapping executions on a lane under a worker, an
execution no task claims, a phase outside waves, a no-op task, a "task failed"
instant, and a last wave and execution slice that never end (as in a trace
cut while written). And Ray's own events where tracer.ray draws them (a
'Ray states' track under a lane, a 'Ray phases' track under a worker) for
some tasks only, one of them with a Ray span that starts before its dispatch
(another node's clock) and no 'deserialize arguments' phase. All times are
ns after BASE; the expected values of every analysis are in
test_query_analyses.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracer.format import TraceWriter
from tracer.ray import layout as L

BASE = 1_000_000_000_000
NODE = "Node 0 (abc)"


def write(path: Path) -> Path:
    events: list[tuple[int, int, Callable[[], Any]]] = []
    with TraceWriter(path, clock=lambda: BASE) as w:
        root = w.track(f"{L.RUN_TRACK_PREFIX} syn", child_ordering="explicit")
        sched = w.track(f"{L.SCHEDULER_PROCESS} (synthetic)", parent=root, rank=0)
        loop = w.track(L.DISPATCH_LOOP_THREAD, parent=sched)
        tasks_root = w.track(L.TASKS_TRACK, parent=root, rank=1)
        lanes = [w.track(L.TASK_LANE, parent=tasks_root) for _ in range(3)]
        node = w.track(NODE, parent=root, rank=3)
        w11 = w.track(f"{L.WORKER_THREAD_PREFIX} 11", parent=node)
        w12 = w.track(f"{L.WORKER_THREAD_PREFIX} 12", parent=node)
        w12_lane = w.track(f"{L.WORKER_THREAD_PREFIX} 12", parent=w12)

        def at(ts: int, fn: Callable[[], Any]) -> None:
            events.append((ts, len(events), fn))

        def span(track: Any, name: str, start: int, end: int | None, cat: str,
                 args: dict[str, Any] | None = None, end_args: dict[str, Any] | None = None
                 ) -> None:
            at(start, lambda: w.begin(track, name, BASE + start, category=cat, args=args))
            if end is not None:
                at(end, lambda: w.end(track, BASE + end, args=end_args))

        sch = L.CAT_SCHEDULER
        span(loop, L.SLICE_EXECUTION, 0, None, sch, {"execution_id": "syn", "runner": "synthetic",
                                                     "tracing_level": 1})
        span(loop, L.SLICE_PLAN_POLLING, 5, 15, sch)
        span(loop, L.SLICE_WAVE, 20, 520, sch, {"wave": 0})
        span(loop, L.SLICE_BATCHING, 21, 61, sch)
        span(loop, L.SLICE_PLAN_POLLING, 25, 35, sch)
        span(loop, L.SLICE_PLAN_POLLING, 40, 50, sch)
        span(loop, L.SLICE_DISPATCHING, 62, 82, sch)
        span(loop, L.SLICE_AWAITING, 100, 400, sch)
        span(loop, L.SLICE_NOOP_TASK, 410, 430, sch)
        span(loop, L.SLICE_WAVE, 600, None, sch, {"wave": 1})
        span(loop, L.SLICE_AWAITING, 650, 1100, sch)
        at(55, lambda: w.instant(loop, L.INSTANT_TASK_ADDED, BASE + 55, category=sch))

        def task(lane: Any, task_id: str, stage_id: int, stage: str, created: int,
                 dispatched: int, end: int, memory: int, attempt: int = 0,
                 end_args: dict[str, Any] | None = None) -> None:
            args: dict[str, Any] = {
                L.ARG_TASK_ID: task_id, L.ARG_STAGE_ID: stage_id, L.ARG_STAGE: stage,
                L.ARG_RESOURCE_REQUEST: {"num_cpus": 1, "num_gpus": 0, "memory_bytes": memory},
            }
            if attempt:
                args[L.ARG_ATTEMPT] = attempt
            cat = L.CAT_TASK
            at(created, lambda: w.begin(lane, stage, BASE + created, category=cat, args=args))
            at(dispatched, lambda: w.begin(lane, L.SLICE_DISPATCHED, BASE + dispatched,
                                           category=cat))
            at(end, lambda: w.end(lane, BASE + end))  # the nested slice first
            at(end, lambda: w.end(lane, BASE + end, args=end_args))

        task(lanes[0], "a-0", 0, "map", 30, 70, 450, 100)
        task(lanes[1], "a-1", 0, "map", 45, 75, 300, 100,
             end_args={L.ARG_STATUS: "superseded"})
        task(lanes[1], "a-1", 0, "map", 305, 310, 700, 100, attempt=1)
        task(lanes[0], "b-0", 1, "reduce", 500, 520, 800, 0,
             end_args={L.ARG_STATUS: "failed", L.ARG_ERROR_TYPE: "OutOfMemoryError",
                       L.ARG_MEMORY_REQUESTED: 0, L.ARG_MEMORY_AT_KILL: 5000})
        task(lanes[2], "b-1", 1, "reduce", 510, 530, 1150, 0,
             end_args={L.ARG_STATUS: "unfinished"})

        ex = L.CAT_EXECUTION
        span(w11, "map", 150, 350, ex, {L.ARG_TASK_ID: "a-0", L.ARG_MEMORY_REQUESTED: 100,
                                        L.ARG_MEMORY_PEAK: 250, L.ARG_OVER_REQUEST: True})
        span(w12, "map", 120, 200, ex, {L.ARG_TASK_ID: "a-1", L.ARG_MEMORY_REQUESTED: 100})
        span(w12, "map", 400, 600, ex, {L.ARG_TASK_ID: "a-1", L.ARG_MEMORY_REQUESTED: 100,
                                        L.ARG_MEMORY_PEAK: 50, L.ARG_HEAP_PEAK: 50})
        span(w12_lane, "reduce", 550, 1150, ex, {L.ARG_TASK_ID: "b-1"})
        span(w11, "task", 1000, 1200, ex, {L.ARG_TASK_ID: "zzz"})
        at(800, lambda: w.instant(w11, L.INSTANT_TASK_FAILED, BASE + 800, category=ex,
                                  args={L.ARG_TASK_ID: "b-0"}))

        # Ray's events (README, "Ray's own events").
        def states(track: Any, head: dict[str, Any], *points: tuple[str, int], end: int
                   ) -> None:
            bounds = [ts for _, ts in points] + [end]
            for i, (name, ts) in enumerate(points):
                span(track, name, ts, bounds[i + 1], sch, head if i == 0 else None)

        states(w.track(L.RAY_STATES_TRACK, parent=lanes[0]), {L.ARG_TASK_ID: "a-0"},
               (L.STATE_PENDING_NODE, 72), (L.STATE_SUBMITTED, 100),
               (L.STATE_RUNNING, 120), (L.STATE_FINISHED, 380), end=450)
        # Both attempts of a-1 on one track (its lane's), each headed by its attempt.
        lane1_states = w.track(L.RAY_STATES_TRACK, parent=lanes[1])
        states(lane1_states, {L.ARG_TASK_ID: "a-1"}, (L.STATE_SUBMITTED, 90),
               (L.STATE_RUNNING, 110), end=300)
        states(lane1_states, {L.ARG_TASK_ID: "a-1", L.ARG_ATTEMPT: 1},
               (L.STATE_SUBMITTED, 330), (L.STATE_RUNNING, 340), (L.STATE_FINISHED, 690),
               end=700)
        # States of a task the trace does not have: ignored, not given to the task before.
        states(w.track(L.RAY_STATES_TRACK, parent=lanes[2]), {L.ARG_TASK_ID: "nope"},
               (L.STATE_SUBMITTED, 540), (L.STATE_FINISHED, 560), end=570)

        def ray_task(track: Any, task_id: str, start: int, end: int,
                     phases: list[tuple[str, int, int]]) -> None:
            span(track, f"{L.RAY_TASK_PREFIX}map", start, end, sch, {L.ARG_TASK_ID: task_id})
            for name, p_start, p_end in phases:
                span(track, name, p_start, p_end, sch)

        phases11 = w.track(L.RAY_PHASES_TRACK, parent=w11)
        phases12 = w.track(L.RAY_PHASES_TRACK, parent=w12)
        ray_task(phases11, "a-0", 110, 370, [(L.PHASE_DESERIALIZE, 110, 130),
                                             (L.PHASE_EXECUTE, 140, 355),
                                             (L.PHASE_STORE_OUTPUTS, 355, 368)])
        ray_task(phases12, "a-1", 100, 210, [(L.PHASE_DESERIALIZE, 100, 105)])
        ray_task(phases12, "a-1", 390, 620, [(L.PHASE_DESERIALIZE, 390, 395)])
        ray_task(w.track(L.RAY_PHASES_TRACK, parent=w12_lane), "b-1", 520, 1160, [])

        for _, _, fn in sorted(events, key=lambda e: (e[0], e[1])):
            fn()
    return path

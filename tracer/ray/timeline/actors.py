"""Actor pools starting: each actor an ``actor starting`` slice under its stage.

An engine with actor pools (Ray Data's map operators with a class UDF)
creates its actors before any task can run on them, and an actor's start
(a model loaded in ``__init__``) can take longer than every task after it:
drawn, a slow start is where the time went; undrawn, the trace stayed empty
until the first task. Each stage's actors go on its *actors starting* lanes
(tracks of one name, which the UI merges), a lane reused only by an actor
created after the last slice on it ended, so that overlapping starts never
break nesting.
"""

from __future__ import annotations

from typing import Any

from tracer.format import TraceWriter, Track
from tracer.ray import layout as L
from tracer.ray.timeline.stages import Stages

__all__ = ["ActorStart", "ActorStarts"]


class ActorStart:
    """One actor of a stage's pool while it starts (:meth:`ActorStarts.starting`)."""

    __slots__ = ("ended", "lane", "stage_id", "ts")

    def __init__(self, stage_id: Any, lane: Track, ts: int) -> None:
        self.stage_id = stage_id
        self.lane = lane
        self.ts = ts
        self.ended = False


class ActorStarts:
    """The *actors starting* lanes of a run's stages."""

    def __init__(self, writer: TraceWriter, stages: Stages, run_start: int) -> None:
        self.writer = writer
        self._stages = stages
        self._run_start = run_start
        # Each stage's free lanes, with when their last slice ended.
        self._free: dict[Any, list[tuple[Track, int]]] = {}

    def starting(
        self, stage_id: Any, stage_name: str | None, ts: int, args: dict[str, Any] | None
    ) -> ActorStart:
        """See :meth:`tracer.ray.timeline.RunTimeline.actor_starting`."""
        begin: dict[str, Any] = {
            L.ARG_STAGE_ID: stage_id, L.ARG_STAGE: stage_name or f"stage {stage_id}",
        }
        if args:
            begin.update(args)
        if ts < self._run_start:
            begin[L.ARG_BEGAN_BEFORE_RUN] = self._run_start - ts
            ts = self._run_start
        free = self._free.setdefault(stage_id, [])
        lane = None
        for i, (_track, released) in enumerate(free):
            if released < ts:  # a lane is reused only after its last slice ended
                lane = free.pop(i)[0]
                break
        if lane is None:
            lane = self.writer.track(
                L.ACTOR_START_TRACK, parent=self._stages.track(stage_id, stage_name), rank=0
            )
        self.writer.begin(lane, L.SLICE_ACTOR_STARTING, ts, category=L.CAT_STAGE, args=begin)
        return ActorStart(stage_id, lane, ts)

    def started(self, start: ActorStart, ts: int, args: dict[str, Any] | None) -> None:
        """See :meth:`tracer.ray.timeline.RunTimeline.actor_started`."""
        if start.ended:
            return
        start.ended = True
        ts = max(ts, start.ts)
        self.writer.end(start.lane, ts, args=args)
        self._free.setdefault(start.stage_id, []).append((start.lane, ts))

"""Stages of a run: a slice per stage on its track under Stages, with an arrow to each execution.

A stage's slice spans its first task's creation to its last task's end: it
begins when its first task is created and ends once the stage is done (or
at the close), with the memory its tasks asked for and used summarised on
its END (trace_processor merges END args into the slice's). Each task's
creation is a ``task launched`` instant nested in the slice, and the arrow
to the task's first execution starts there, at the moment of the launch
(an arrow from the stage slice itself would start at the slice's end). A
task created after its stage's slice was ended opens a new slice for the
stage on the same track.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from tracer.format import TraceWriter, Track
from tracer.ray import layout as L
from tracer.stats import nearest_rank

__all__ = ["Stage", "Stages"]

_MAX_STAGE_RANK = 100_000


class Stage:
    """One stage's slice in the making."""

    __slots__ = (
        "done",
        "end_args",
        "first_ts",
        "last_ts",
        "name",
        "outstanding",
        "over_request",
        "peaks",
        "request_fixes",
        "requests",
        "stage_id",
        "tasks",
        "track",
        "written",
    )

    def __init__(self, stage_id: Any, name: str, track: Track, ts: int) -> None:
        self.stage_id = stage_id
        self.name = name
        self.track = track
        self.first_ts = ts
        self.last_ts = ts
        self.outstanding = 0  # tasks created and not ended
        self.tasks = 0
        self.requests: list[int] = []
        #: (the runner's request, what Ray reserved) of the tasks where they differ.
        self.request_fixes: list[tuple[int, int]] = []
        self.peaks: list[int] = []
        self.over_request = 0
        self.written = False
        #: The producer said no more tasks will come (its summary may wait for executions).
        self.done = False
        #: More annotations of its END, the producer's own (:meth:`RunTimeline.stage_figures`).
        self.end_args: dict[str, Any] = {}


class Stages:
    """The run's stages by id, under one root track in the order they first appear."""

    def __init__(self, writer: TraceWriter, root: Track) -> None:
        self.writer = writer
        self.root = root
        self.by_id: dict[Any, Stage] = {}
        #: Each stage's track, declared at its first task or before (:meth:`track`).
        self._tracks: dict[Any, Track] = {}

    def get(self, stage_id: Any) -> Stage | None:
        return self.by_id.get(stage_id)

    def track(self, stage_id: Any, name: str | None) -> Track:
        """The stage's track, declared now if its first task is still to come (a stage
        whose actors start first), ranked by id (ids are the stages' order for every
        producer; any other id after them, in the order of first use)."""
        track = self._tracks.get(stage_id)
        if track is None:
            name = name or f"stage {stage_id}"
            rank = (
                stage_id if isinstance(stage_id, int) and 0 <= stage_id < _MAX_STAGE_RANK
                else _MAX_STAGE_RANK + len(self._tracks)
            )
            track = self._tracks[stage_id] = self.writer.track(
                f"{stage_id}: {name}", parent=self.root, rank=rank, merge=False
            )
        return track

    def for_new_task(self, stage_id: Any, name: str | None, ts: int) -> Stage:
        """The stage a task created at ``ts`` belongs to (a new one, or a new slice of it)."""
        stage = self.by_id.get(stage_id)
        if stage is None:
            name = name or f"stage {stage_id}"
            track = self.track(stage_id, name)
            stage = self.by_id[stage_id] = Stage(stage_id, name, track, ts)
        elif stage.written:  # a task after the stage was done: a slice of its own
            stage = self.by_id[stage_id] = Stage(stage_id, stage.name, stage.track, ts)
        else:
            return stage
        self.writer.begin(
            stage.track, stage.name, ts, category=L.CAT_STAGE,
            args={L.ARG_STAGE_ID: stage.stage_id},
        )
        return stage

    def launched(self, stage: Stage, task_id: str, ts: int) -> int:
        """A task of ``stage`` was created at ``ts``: its mark, and the id of its arrow."""
        flow = self.writer.new_flow_id()
        self.writer.instant(
            stage.track, L.INSTANT_TASK_LAUNCHED, ts, category=L.CAT_STAGE,
            args={L.ARG_STAGE_ID: stage.stage_id, L.ARG_TASK_ID: task_id}, flows=(flow,),
        )
        return flow

    def write(self, stage: Stage) -> None:
        """The end of the stage's slice, with its memory summary (once)."""
        if stage.written:
            return
        stage.written = True
        args: dict[str, Any] = {"num_tasks": stage.tasks}
        if stage.requests:
            args[L.ARG_MEMORY_REQUESTED] = summary(_requests(stage))
        if stage.peaks:
            args[L.ARG_MEMORY_PEAK] = summary(stage.peaks)
            args[L.ARG_TASKS_OVER_REQUEST] = stage.over_request
        args.update(stage.end_args)
        self.writer.end(stage.track, max(stage.last_ts, stage.first_ts), args=args)

    def write_all(self) -> None:
        for stage in self.by_id.values():
            self.write(stage)


def summary(values: Iterable[int]) -> dict[str, int]:
    """min, p50 (nearest rank, as ``tracer summary`` takes it) and max of a stage's
    per-task values."""
    vals = sorted(values)
    return {"min": vals[0], "p50": nearest_rank(vals, 50) or 0, "max": vals[-1]}


def _requests(stage: Stage) -> list[int]:
    """The stage's memory requests, with Ray's figure where it reserved another."""
    if not stage.request_fixes:
        return stage.requests
    counts = Counter(stage.requests)
    for runner, reserved in stage.request_fixes:
        if counts[runner] > 0:
            counts[runner] -= 1
            counts[reserved] += 1
    return list(counts.elements())

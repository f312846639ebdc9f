"""What the runner tracer keeps of one task, in the timeline's own per-task object."""

from __future__ import annotations

from typing import Any

from tracer.format import Track
from tracer.ray.resources import ResourceRequest
from tracer.ray.task_metrics import Metrics
from tracer.ray.timeline import TimelineTask

__all__ = ["RunnerTask"]


class RunnerTask(TimelineTask):
    """A task of the runner tracer: its timeline state, and where its measurements are."""

    __slots__ = ("metrics", "metrics_ref", "ray_task", "received_ts")

    def __init__(
        self, task_id: str, stage_id: Any, lane: Track, flow: int, request: ResourceRequest
    ) -> None:
        super().__init__(task_id, stage_id, lane, flow, request)
        #: The return-channel ref its measurements arrive in (None: none, or read).
        self.metrics_ref: Any = None
        #: Measurements fetched in a batch, not yet written.
        self.metrics: Metrics | None = None
        #: Ray's TaskID of a task that reports through Ray's events (no return channel):
        #: its execution is drawn from them once it ended.
        self.ray_task: Any = None
        #: When the runner saw it ready (its slices end then, once its batch completes).
        self.received_ts = 0

"""The run timeline: how a run is drawn in a trace, whoever reports its facts.

Producers (the runner tracer and its measurement channels, the integrations)
call :class:`RunTimeline` with plain facts; it writes them through the format
layer in the layout of :mod:`tracer.ray.layout`. See :mod:`.run`.
"""

from tracer.ray.timeline.actors import ActorStart
from tracer.ray.timeline.memory import MemoryTrace
from tracer.ray.timeline.ray_phases import RayTaskEvents
from tracer.ray.timeline.run import (
    CANCEL_ERRORS,
    Measurements,
    RunTimeline,
    TimelineTask,
)

__all__ = [
    "CANCEL_ERRORS",
    "ActorStart",
    "Measurements",
    "MemoryTrace",
    "RayTaskEvents",
    "RunTimeline",
    "TimelineTask",
]

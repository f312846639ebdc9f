"""The format layer: writes and reads native Perfetto protobuf traces.

It knows nothing of Ray; everything else in tracer writes through it.
"""

from tracer.format.model import (
    CounterSample,
    Flow,
    Instant,
    Problem,
    ProblemKind,
    Slice,
    TraceModel,
    TrackInfo,
    TrackKind,
)
from tracer.format.reader import DEFAULT_MAX_BUNDLE_SIZE, read_trace
from tracer.format.writer import (
    ChildOrdering,
    CounterSequence,
    CounterTrack,
    CounterUnit,
    TraceWriter,
    Track,
)

__all__ = [
    "DEFAULT_MAX_BUNDLE_SIZE",
    "ChildOrdering",
    "CounterSample",
    "CounterSequence",
    "CounterTrack",
    "CounterUnit",
    "Flow",
    "Instant",
    "Problem",
    "ProblemKind",
    "Slice",
    "TraceModel",
    "TraceWriter",
    "Track",
    "TrackInfo",
    "TrackKind",
    "read_trace",
]

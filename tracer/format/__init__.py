"""The format layer: writes and reads native Perfetto protobuf traces.

:class:`TraceWriter` writes; :func:`read_trace` reads a whole trace into a
:class:`TraceModel`; :func:`scan_trace` hands the same events to a
:class:`TraceVisitor` one at a time, for traces too big to hold;
:func:`check_framing` says whether a file is whole without decoding it.
Each reads gzip-compressed traces too.

It knows nothing of Ray; everything else in tracer writes through it.
"""

from tracer.format.integrity import Framing, check_framing
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
from tracer.format.scan import (
    DEFAULT_WINDOW_NS,
    ScannedInstant,
    ScannedSlice,
    TraceScan,
    TraceVisitor,
    scan_trace,
)
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
    "DEFAULT_WINDOW_NS",
    "ChildOrdering",
    "CounterSample",
    "CounterSequence",
    "CounterTrack",
    "CounterUnit",
    "Flow",
    "Framing",
    "Instant",
    "Problem",
    "ProblemKind",
    "ScannedInstant",
    "ScannedSlice",
    "Slice",
    "TraceModel",
    "TraceScan",
    "TraceVisitor",
    "TraceWriter",
    "Track",
    "TrackInfo",
    "TrackKind",
    "check_framing",
    "read_trace",
    "scan_trace",
]

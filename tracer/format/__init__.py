"""The format layer: writes and reads native Perfetto protobuf traces.

It knows nothing of Ray; everything else in tracer writes through it.
"""

from tracer.format.writer import ChildOrdering, CounterTrack, CounterUnit, TraceWriter, Track

__all__ = ["ChildOrdering", "CounterTrack", "CounterUnit", "Track", "TraceWriter"]

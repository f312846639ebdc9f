"""A TrackDescriptor as trace_processor reads it: one :class:`TrackInfo` per track.

Which fields win (a thread's or process's own name over the track's),
which omissions make trace_processor ignore the descriptor (a thread
without both pid and tid, a process without a pid), and the counter's
unit, multiplier, incremental flag and shared y axis.
"""

from __future__ import annotations

from tracer._proto import perfetto_trace_subset_pb2 as pb
from tracer.format._sequence import _text
from tracer.format._wire import CHILD_ORDERING, COUNTER_UNITS
from tracer.format.model import TrackInfo, TrackKind

__all__: list[str] = []

_COUNTER_UNITS = {value: name for name, value in COUNTER_UNITS.items()}
_CHILD_ORDERING = {value: name for name, value in CHILD_ORDERING.items()}
_MERGE_BEHAVIOR = {1: "by_track_name", 2: "none", 3: "by_sibling_merge_key"}


def track_info(desc: pb.TrackDescriptor, uuid: int) -> TrackInfo | str:
    """The track ``desc`` (uuid ``uuid``, not the root) describes, or why trace_processor
    ignores it."""
    has = desc.HasField
    name = (
        _text(desc.name)
        if has("name")
        else (_text(desc.static_name) if has("static_name") else None)
    )
    kind: TrackKind = "track"
    pid = tid = None
    unit = None
    unit_multiplier = 1
    is_incremental = False
    y_axis = None
    if has("thread"):
        thread = desc.thread
        if not (thread.HasField("pid") and thread.HasField("tid")):
            return f"thread track {uuid} without both pid and tid; ignored"
        kind, pid, tid = "thread", thread.pid, thread.tid
        if thread.HasField("thread_name"):
            name = _text(thread.thread_name)
    elif has("process"):
        process = desc.process
        if not process.HasField("pid"):
            return f"process track {uuid} without a pid; ignored"
        kind, pid = "process", process.pid
        if process.HasField("process_name"):
            name = _text(process.process_name)
    elif has("counter"):
        counter = desc.counter
        kind = "counter"
        if counter.type == 1:
            unit = "ns"
        elif counter.type == 2:
            unit = "count"
        elif counter.unit in _COUNTER_UNITS:
            unit = _COUNTER_UNITS[counter.unit]
        elif counter.HasField("unit_name"):
            unit = _text(counter.unit_name)
        if counter.unit_multiplier > 0:
            unit_multiplier = counter.unit_multiplier
        is_incremental = counter.is_incremental
        y_axis = (
            _text(counter.y_axis_share_key) if counter.HasField("y_axis_share_key") else None
        )
    return TrackInfo(
        uuid=uuid,
        name=name,
        kind=kind,
        parent_uuid=desc.parent_uuid if has("parent_uuid") else None,
        pid=pid,
        tid=tid,
        unit=unit,
        unit_multiplier=unit_multiplier,
        is_incremental=is_incremental,
        sibling_order_rank=desc.sibling_order_rank if has("sibling_order_rank") else None,
        child_ordering=_CHILD_ORDERING.get(desc.child_ordering),
        sibling_merge_behavior=_MERGE_BEHAVIOR.get(desc.sibling_merge_behavior),
        description=_text(desc.description) if has("description") else None,
        y_axis_share_key=y_axis,
    )


def ordering(value: int) -> str:
    """A root descriptor's process/thread ordering as the model names it."""
    return "explicit" if value == 1 else f"unknown({value})"

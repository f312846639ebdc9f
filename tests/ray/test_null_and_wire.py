"""Level 0's context managers, and the task context as it crosses to a task.

No Ray needed: these are the pieces whose cheapness is their point, checked
for behaving exactly like the ordinary Python they replace.
"""

from __future__ import annotations

import pickle

import msgpack
import pytest

from tracer.ray import NullRunnerTracer, TaskContext


def _blocks(tracer: NullRunnerTracer) -> list[object]:
    return [
        tracer.dispatch_wave(3),
        tracer.dispatch_batching(),
        tracer.dispatching(),
        tracer.awaiting(1, 0.1),
        tracer.awaiting(),
        tracer.get_next_physical_plan(),
        tracer.plan_polling(),
    ]


def test_null_blocks_yield_an_updater_that_takes_anything() -> None:
    for block in _blocks(NullRunnerTracer()):
        with block as update:  # type: ignore[attr-defined]
            assert update(1, "x", dispatched=2, received=3, inflight=4) is None
            assert update() is None


def test_null_blocks_let_exceptions_through_and_can_nest_and_repeat() -> None:
    tracer = NullRunnerTracer()
    for block in _blocks(tracer):
        with pytest.raises(KeyError, match="boom"), block:  # type: ignore[attr-defined]
            raise KeyError("boom")
    # The same (shared) context manager, nested in itself and reused.
    with tracer.dispatch_wave(0), tracer.dispatch_wave(1), tracer.dispatching():
        outer = tracer.dispatching()
    with outer, outer:
        pass
    ctx = tracer.dispatching()
    assert ctx.__exit__(None, None, None) is not True  # never swallows


def test_task_context_round_trips_through_its_wire_form() -> None:
    ctx = TaskContext("exec-1", "2-17", 2, 2, True, True, False)
    wire = ctx.to_wire()
    assert type(wire) is tuple
    assert TaskContext.from_wire(wire) == ctx
    # Plain values only, so Ray can msgpack it (which turns tuples into lists).
    unpacked = msgpack.unpackb(msgpack.packb(wire))
    assert isinstance(unpacked, list)
    assert TaskContext.from_wire(unpacked) == ctx
    assert pickle.loads(pickle.dumps(wire)) == wire

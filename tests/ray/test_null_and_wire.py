"""Level 0's context managers, and what a traced call sends to its task.

No Ray cluster needed: these are the pieces whose cheapness is their point, checked
for behaving exactly like the ordinary Python they replace.
"""

from __future__ import annotations

import pickle

import pytest

from tracer.ray import NullRunnerTracer, TaskContext
from tracer.ray.wrappers import _traced_remote


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


def test_level_0_takes_every_call_level_1_takes() -> None:
    """A runner's code runs against both: a method or a parameter the level-0 tracer lacks
    (close(wait=) did) fails only when tracing is off, the default, where nobody looks."""
    import inspect

    from tracer.ray import RunnerTracer

    for name in dir(RunnerTracer):
        method = getattr(RunnerTracer, name)
        if name.startswith("_") or not callable(method):
            continue
        null = getattr(NullRunnerTracer, name, None)
        assert null is not None, name
        ours = inspect.signature(method).parameters
        theirs = inspect.signature(null).parameters
        assert [(p.name, p.kind) for p in ours.values()] == [
            (p.name, p.kind) for p in theirs.values()], name
    NullRunnerTracer().close(None, wait=True)


def test_task_context_for_another_task_keeps_the_execution_settings() -> None:
    ctx = TaskContext("exec-1", "2-17", 2, 2, True, True, False)
    other = ctx.for_task("3-1")
    assert other == TaskContext("exec-1", "3-1", None, 2, True, True, False)
    assert pickle.loads(pickle.dumps(other)) == other


def test_traced_remote_functions_are_shared_per_execution_settings() -> None:
    """Only the task id travels with a call: the rest is baked into a cached function."""
    import ray

    @ray.remote
    def user_fn(x: int) -> int:
        return x

    level1 = TaskContext("exec-1", "0-1", 0, 1)
    same = _traced_remote(user_fn, level1, 1)
    # Another task, another execution, same settings: the same function.
    assert _traced_remote(user_fn, TaskContext("exec-2", "5-9", 5, 1), 1) is same
    # Settings that change what the task does: another function.
    assert _traced_remote(user_fn, TaskContext("exec-1", "0-1", 0, 2), 1) is not same
    assert _traced_remote(user_fn, level1, 2) is not same
    # With a metrics actor the execution id names it: one function per execution.
    with_actor = _traced_remote(user_fn, TaskContext("exec-1", "0-1", 0, 1, metrics_actor=True), 1)
    assert with_actor is not same
    assert _traced_remote(user_fn, TaskContext("exec-3", "0-1", 0, 1, metrics_actor=True), 1) \
        is not with_actor

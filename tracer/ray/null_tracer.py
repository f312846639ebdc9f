"""The tracer at level 0: the runner tracer's methods, every one doing nothing.

Runners call the tracer on every task and every wave whether tracing is on
or not, so at level 0 each call must cost no more than a method call
(``bench_runner.py`` checks 100 ns): no file, no thread, no actor, no state.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tracer.ray.levels import TracingLevel

__all__ = ["NullRunnerTracer"]


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


class _NullContext:
    """A reusable no-op context manager that yields a no-op updater.

    Its ``__enter__`` and ``__exit__`` are C functions, not Python methods:
    Python's ``with`` calls them without running any bytecode, which halves
    the block's cost at level 0 (~60 ns instead of ~110 ns for ``with`` on a
    Python-level no-op). Builtin callables are not descriptors, so as class
    attributes they are called as they are, without ``self``:
    ``__enter__()`` returns ``_noop`` (an ``itertools.repeat`` iterator's
    ``__next__``), and ``__exit__(type, value, tb)`` is ``"".format``, which
    ignores its arguments and returns ``""``: false, so exceptions propagate.
    """

    __slots__ = ()

    if TYPE_CHECKING:  # what they are to a type checker: plain methods

        def __enter__(self) -> Callable[..., None]: ...

        def __exit__(self, *exc: object) -> None: ...

    else:
        __enter__ = itertools.repeat(_noop).__next__
        __exit__ = "".format


_NULL_CONTEXT = _NullContext()


def awaiting_args(
    num_returns: int | None,
    timeout: float | None,
    waiting_for_num_results: int | None,
    wait_timeout_s: float | None,
) -> tuple[int | None, float | None]:
    """``awaiting``'s arguments under tracer's names, given either tracer's or Daft's.

    Daft's RayRunner spells them ``waiting_for_num_results=`` and
    ``wait_timeout_s=``; a runner instrumented for Daft's tracer passes them
    as they are. Both spellings of one argument is a mistake at every level
    (not only when tracing is on, where it would first show).
    """
    if waiting_for_num_results is not None:
        if num_returns is not None:
            raise TypeError(
                "awaiting() got both num_returns and waiting_for_num_results (the same argument)"
            )
        num_returns = waiting_for_num_results
    if wait_timeout_s is not None:
        if timeout is not None:
            raise TypeError("awaiting() got both timeout and wait_timeout_s (the same argument)")
        timeout = wait_timeout_s
    return num_returns, timeout


class NullRunnerTracer:
    """The tracer at level 0: every call does nothing and costs a method call."""

    enabled = False
    disabled = False
    level = TracingLevel.OFF
    trace_path = None
    execution_id = ""

    def dispatch_wave(self, wave_num: int) -> _NullContext:
        return _NULL_CONTEXT

    def dispatch_batching(self) -> _NullContext:
        return _NULL_CONTEXT

    def dispatching(self) -> _NullContext:
        return _NULL_CONTEXT

    def awaiting(
        self,
        num_returns: int | None = None,
        timeout: float | None = None,
        waiting_for_num_results: int | None = None,
        wait_timeout_s: float | None = None,
    ) -> _NullContext:
        # Daft's names, not keyword-only: CPython 3.11 calls a function without
        # keyword-only parameters on a faster path (~20 ns less here).
        if waiting_for_num_results is not None or wait_timeout_s is not None:
            awaiting_args(num_returns, timeout, waiting_for_num_results, wait_timeout_s)
        return _NULL_CONTEXT

    def get_next_physical_plan(self) -> _NullContext:
        return _NULL_CONTEXT

    plan_polling = get_next_physical_plan

    def mark_noop_task_start(self) -> None:
        pass

    def mark_noop_task_end(self) -> None:
        pass

    def mark_handle_none_task(self) -> None:
        pass

    def mark_handle_materialized_result(self) -> None:
        pass

    def mark_handle_task_add_to_batch(self) -> None:
        pass

    def mark_dispatch_task(self) -> None:
        pass

    def mark_dispatch_actor_task(self) -> None:
        pass

    def count_inflight_tasks(self, count: int) -> None:
        pass

    def task_created(
        self,
        task_id: str,
        stage_id: int,
        resource_request: Any,
        instructions: str | None = None,
        *,
        stage_name: str | None = None,
    ) -> None:
        pass

    def task_dispatched(self, task_id: str) -> None:
        return None

    def register_metrics_ref(self, task_id: str, ref: Any) -> None:
        pass

    def register_ray_task(self, task_id: str, ref: Any) -> None:
        pass

    def task_not_ready(self, task_id: str) -> None:
        pass

    def task_received_as_ready(self, task_id: str, stage_id: int | None = None) -> None:
        pass

    def tasks_received_as_ready(self, task_ids: Iterable[str]) -> dict[str, BaseException]:
        return {}  # a new dict each time: a runner may add its own failures to it

    def complete_received(self) -> dict[str, BaseException]:
        return {}

    def task_failed(self, task_id: str, error: BaseException) -> None:
        pass

    def task_cancelled(self, task_id: str) -> None:
        pass

    def stage_done(self, stage_id: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, error: BaseException | None = None, *, wait: bool | None = None) -> None:
        pass

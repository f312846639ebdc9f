"""The runner tracer's dispatch-loop calls: waves, their phases, marks, counters.

These are the calls a dispatch loop makes most often (several per wave, some
per task), so each is a few writes and nothing more: the guard is spelled
out inline rather than through a wrapper (a wrapper is one more Python frame
and an argument tuple per call, and between two of Ray's calls the loop runs
on cold CPU caches), and the ``with`` blocks are small classes rather than
generator-based context managers (~1.5 µs a block).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from tracer.ray import layout as L
from tracer.ray.null_tracer import awaiting_args
from tracer.ray.timeline import RunTimeline

__all__ = ["LoopCalls"]

logger = logging.getLogger("tracer")


class LoopCalls:
    """The dispatch-loop half of :class:`~tracer.ray.RunnerTracer`'s API (a mixin)."""

    # Provided by RunnerTracer.
    _disabled: bool
    _lock: threading.RLock
    _timeline: RunTimeline
    _noop_open: int
    _wave_counts: dict[str, int] | None
    _misuse_said: set[str]

    def _disable(self, exc: BaseException) -> None:
        raise NotImplementedError

    def _end_wave(self, metrics: dict[str, Any]) -> None:
        raise NotImplementedError

    def _say_misuse(self, kind: str, message: str, *args: Any) -> None:
        """One warning per kind of misuse and tracer: the trace is still drawn, but not
        as the runner meant, and nothing else would tell it."""
        said = self._misuse_said
        if kind in said:
            return
        said.add(kind)
        logger.warning("tracer: " + message, *args)

    def dispatch_wave(
        self, wave_num: int
    ) -> contextlib.AbstractContextManager[Callable[..., None]]:
        """A wave of the dispatch loop; yields ``update(**metrics)`` for the wave's args."""
        return _Wave(self, wave_num)

    def _begin_loop(self, name: str, args: dict[str, Any] | None = None) -> None:
        if self._disabled:
            return
        try:
            with self._lock:
                self._timeline.begin_loop(name, args)
        except Exception as exc:
            self._disable(exc)

    def _end_loop(self, args: dict[str, Any] | None = None) -> None:
        if self._disabled:
            return
        try:
            with self._lock:
                timeline = self._timeline
                timeline.end_loop(args)
                # Tasks in flight and what is available, as of this phase's end: a loop
                # that dispatches at a wave's start and waits the rest of it (Daft's)
                # would otherwise see them a wave late.
                timeline.sample_resources_if_changed()
        except Exception as exc:
            self._disable(exc)

    def dispatch_batching(self) -> contextlib.AbstractContextManager[Callable[..., None]]:
        """Collecting tasks from the plan into a dispatch batch."""
        return _LoopSlice(self, L.SLICE_BATCHING, None)

    def dispatching(self) -> contextlib.AbstractContextManager[Callable[..., None]]:
        """Submitting the batch to Ray."""
        return _LoopSlice(self, L.SLICE_DISPATCHING, None)

    def awaiting(
        self,
        num_returns: int | None = None,
        timeout: float | None = None,
        waiting_for_num_results: int | None = None,
        wait_timeout_s: float | None = None,
    ) -> contextlib.AbstractContextManager[Callable[..., None]]:
        """Waiting on in-flight tasks (``ray.wait``); yields ``update(**args)`` (``num_ready``).

        ``waiting_for_num_results`` and ``wait_timeout_s`` are Daft's names for
        ``num_returns`` and ``timeout``.
        """
        if waiting_for_num_results is not None or wait_timeout_s is not None:
            num_returns, timeout = awaiting_args(
                num_returns, timeout, waiting_for_num_results, wait_timeout_s
            )
        args: dict[str, Any] = {}
        if num_returns is not None:
            args["num_returns"] = num_returns
        if timeout is not None:
            args["timeout_s"] = float(timeout)
        return _LoopSlice(self, L.SLICE_AWAITING, args)

    def get_next_physical_plan(self) -> contextlib.AbstractContextManager[Callable[..., None]]:
        """Polling the plan for its next item; yields ``update(**args)``."""
        return _LoopSlice(self, L.SLICE_PLAN_POLLING, None)

    plan_polling = get_next_physical_plan

    def _loop_instant(self, name: str, args: dict[str, Any] | None = None) -> None:
        if self._disabled:
            return
        try:
            with self._lock:
                self._timeline.loop_instant(name, args)
        except Exception as exc:
            self._disable(exc)

    def mark_noop_task_start(self) -> None:
        """A task the runner completes without Ray (e.g. a no-op) starts."""
        self._noop_open += 1
        self._begin_loop(L.SLICE_NOOP_TASK)

    def mark_noop_task_end(self) -> None:
        """Its end; one without a start is ignored (it would end the loop's enclosing slice)."""
        if self._noop_open:
            self._noop_open -= 1
            self._end_loop()

    def mark_handle_none_task(self) -> None:
        """The plan had nothing ready: it needs in-flight tasks to finish first."""
        self._loop_instant(L.INSTANT_NOTHING_READY)

    def mark_handle_materialized_result(self) -> None:
        """The plan produced a materialised result."""
        self._loop_instant(L.INSTANT_MATERIALIZED)

    def mark_handle_task_add_to_batch(self) -> None:
        """The plan produced a task that joins the dispatch batch (counted per wave)."""
        self._count_or_mark(L.ARG_TASKS_ADDED, L.INSTANT_TASK_ADDED)

    def mark_dispatch_task(self) -> None:
        """A task was submitted (counted per wave)."""
        self._count_or_mark(L.ARG_TASKS_DISPATCHED, L.INSTANT_DISPATCH_TASK)

    def mark_dispatch_actor_task(self) -> None:
        """An actor task was submitted (counted per wave)."""
        self._count_or_mark(L.ARG_ACTOR_TASKS_DISPATCHED, L.INSTANT_DISPATCH_ACTOR_TASK)

    def _count_or_mark(self, counter: str, instant: str) -> None:
        """Inside a wave, count into the wave's args (an instant per task would cost
        ~17 bytes and a few µs each, for what the task slices already show);
        outside one, write an instant."""
        counts = self._wave_counts
        if counts is not None:
            counts[counter] = counts.get(counter, 0) + 1
        else:
            self._loop_instant(instant)

    def count_inflight_tasks(self, count: int) -> None:
        """Sample the number of tasks in flight."""
        if self._disabled:
            return
        try:
            with self._lock:
                self._timeline.count_inflight(count)
        except Exception as exc:
            self._disable(exc)


class _LoopSlice:
    """A dispatch-loop slice as a ``with`` block; yields ``update(**args)`` for its end."""

    __slots__ = ("_args", "_end_args", "_name", "_tracer")

    def __init__(self, tracer: LoopCalls, name: str, args: dict[str, Any] | None) -> None:
        self._tracer = tracer
        self._name = name
        self._args = args
        self._end_args: dict[str, Any] = {}

    def __enter__(self) -> Callable[..., None]:
        self._tracer._begin_loop(self._name, self._args)
        return self._end_args.update

    def __exit__(self, *exc: object) -> None:
        self._tracer._end_loop(self._end_args or None)


class _Wave:
    """A wave as a ``with`` block; per-wave counts and ``update(**metrics)`` become its args."""

    __slots__ = ("_metrics", "_outer", "_tracer", "_wave_num")

    def __init__(self, tracer: LoopCalls, wave_num: int) -> None:
        self._tracer = tracer
        self._wave_num = wave_num
        self._metrics: dict[str, Any] = {}
        self._outer: dict[str, int] | None = None

    def __enter__(self) -> Callable[..., None]:
        tracer = self._tracer
        self._outer = outer = tracer._wave_counts
        if outer is not None:
            tracer._say_misuse(
                "nested_wave", "dispatch_wave(%r) began inside another wave: waves do not "
                "nest (the dispatch loop's time in waves counts it twice); end a wave before "
                "the next. The outer wave's counts include the inner's.", self._wave_num,
            )
        tracer._begin_loop(L.SLICE_WAVE, {L.ARG_WAVE: self._wave_num})
        tracer._wave_counts = {}
        return self._metrics.update

    def __exit__(self, *exc: object) -> None:
        tracer = self._tracer
        counts, tracer._wave_counts = tracer._wave_counts, self._outer
        if self._outer is not None and counts:
            for key, n in counts.items():
                self._outer[key] = self._outer.get(key, 0) + n
        metrics = self._metrics
        if counts:
            metrics = {**counts, **metrics}
        tracer._end_wave(metrics)

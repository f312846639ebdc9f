"""Ray Data's all-to-all operators: the tasks of one blocking call, traced from the driver.

An all-to-all operator (``random_shuffle``, ``repartition``, ``sort`` and
aggregations under the pull- or push-based shuffle strategies) runs its whole
exchange in one call of the scheduling loop: ``all_inputs_done`` calls its
bulk function, which submits its sample, map, merge and reduce tasks itself
and waits for each round through a sub-progress bar's
``fetch_until_complete``, reporting none of it to the operator's task hooks
(:mod:`.execution`). Left alone, the trace showed no stage, no task (a map
fused into the operator went with it) and one long ``wave`` over empty task
lanes. So, while a traced operator's bulk function runs, in that thread only:

* each Ray task it submits is a task of the operator's stage, dispatched
  then (Ray Data decides and submits in one call), with its own request
  (its options over its remote function's, and Ray's default of one CPU)
  and the function it runs (``ray_function``: ``ShuffleTaskSpec.map``,
  ``ShuffleTaskSpec.reduce``, ``_sample_block``...);
* each wait for a round is an ``awaiting`` slice on the loop, ``waiting_for``
  Ray Data's name of it ("Shuffle Map", "Shuffle Reduce"...); when it
  returns, the tasks whose results it fetched end, with the rows and bytes
  their metadata reports and the node they ran on, and so do the others of
  the operator that Ray has finished (a push-based shuffle's merges): a task
  ends when the driver sees it done, as the runner's tasks end when its loop
  receives them;
* a wait that raised (a task failed) ends the tasks it waited for that
  finished, those whose result is an error with it (``failed``); when the
  bulk function returns, what Ray finished ends, and what it abandoned
  ends ``unfinished``.

These tasks run Ray Data's functions, not an operator's transformer, which is
what measures map tasks in their workers (:mod:`.worker`): their executions
on worker tracks are drawn from Ray's own events once they ended (see
:meth:`.ExecutionTracer.end`), and have no memory figures.

Two hooks serve every traced operator of the process, installed on the first
(``RemoteFunction._remote`` and ``BaseProgressBar.fetch_until_complete``,
wrapped once): while no traced bulk function runs they cost a call frame
and a test of a global (~0.4 µs a task submitted, against the 70-90 µs of CPU
Ray's submission takes in the driver here). Any error in them stops tracing the
execution (:meth:`ExecutionTracer.guard`), never Ray Data's call.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tracer.integrations.ray_data import _compat as compat
from tracer.ray import layout as L

if TYPE_CHECKING:
    from tracer.integrations.ray_data.execution import ExecutionTracer
    from tracer.integrations.ray_data.tasks import DataTask, Stage

__all__ = ["hook_operator", "install_hooks"]

#: The bulk call running in this thread, if traced (``_state.bulk``).
_state = threading.local()
#: Traced bulk calls running in any thread: while 0, the hooks look no further.
_active = 0
_install_lock = threading.Lock()


def hook_operator(op: Any, stage: Stage, tracer: ExecutionTracer) -> Callable[[], None] | None:
    """Trace the bulk calls of ``op`` into ``tracer``'s ``stage``.

    Returns what gives Ray Data its bulk function back, or None when ``op`` is
    not an all-to-all operator (or its function cannot be found).
    """
    original = compat.bulk_fn(op)
    if original is None:
        return None
    install_hooks()
    bulk = _BulkCall(tracer, stage)

    def traced_bulk_fn(*args: Any, **kwargs: Any) -> Any:
        global _active
        outer = getattr(_state, "bulk", None)
        bulk.begin(args[0] if args else kwargs.get("refs"))
        _state.bulk = bulk
        with _install_lock:
            _active += 1
        error: BaseException | None = None
        try:
            return original(*args, **kwargs)
        except BaseException as exc:
            error = exc
            raise
        finally:
            with _install_lock:
                _active -= 1
            _state.bulk = outer
            bulk.done(error)

    traced_bulk_fn.__tracer_hook__ = True  # type: ignore[attr-defined]
    compat.set_bulk_fn(op, traced_bulk_fn)

    def release() -> None:
        if compat.bulk_fn(op) is traced_bulk_fn:
            compat.set_bulk_fn(op, original)

    return release


def install_hooks() -> None:
    """Wrap Ray's task submission and Ray Data's round waits, once per process."""
    from ray.remote_function import RemoteFunction

    bar = compat.progress_bar_class()
    with _install_lock:
        submit = RemoteFunction.__dict__["_remote"]
        if not getattr(submit, "__tracer_hook__", False):
            RemoteFunction._remote = _submit_hook(submit)
        fetch = None if bar is None else bar.__dict__.get("fetch_until_complete")
        if fetch is not None and not getattr(fetch, "__tracer_hook__", False):
            bar.fetch_until_complete = _fetch_hook(fetch)


def _submit_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _remote(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if _active:
            bulk = getattr(_state, "bulk", None)
            if bulk is not None:
                bulk.submitted(self, args, kwargs, result)
        return result

    _remote.__tracer_hook__ = True  # type: ignore[attr-defined]
    return _remote


def _fetch_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def fetch_until_complete(self: Any, refs: Any) -> Any:
        bulk = getattr(_state, "bulk", None) if _active else None
        if bulk is None:
            return original(self, refs)
        bulk.awaiting(self, refs)
        try:
            results = original(self, refs)
        except BaseException as exc:
            bulk.fetched(refs, None, exc)
            raise
        bulk.fetched(refs, results, None)
        return results

    fetch_until_complete.__tracer_hook__ = True  # type: ignore[attr-defined]
    return fetch_until_complete


class _Submitted:
    """A task of the operator, submitted and not yet seen done."""

    __slots__ = ("blocks_in", "function", "num_refs", "ray_task_id", "ref", "task")

    def __init__(
        self, task: DataTask, refs: list[Any], ray_task_id: str, blocks_in: int, function: str
    ) -> None:
        self.task = task
        self.function = function
        # Ready once the task finished. Held only while the task is open: Ray Data holds
        # the task's results at least as long.
        self.ref = refs[0]
        self.num_refs = len(refs)
        self.ray_task_id = ray_task_id
        self.blocks_in = blocks_in


class _BulkCall:
    """One all-to-all operator's tasks while its bulk function runs; see the module doc.

    Every method is called in the bulk function's thread and never raises: the
    facts go through the execution tracer's guard.
    """

    def __init__(self, tracer: ExecutionTracer, stage: Stage) -> None:
        self._tracer = tracer
        self._stage = stage
        self._next_index = 0
        self._open: dict[str, _Submitted] = {}
        self._awaiting = 0  # awaiting slices begun on the loop and not ended
        # The ids (not the refs: they would keep the objects alive) of the blocks of
        # this exchange, its input's and its tasks' outputs, to count what a task reads:
        # its other ref arguments are not blocks (a fused map's function).
        self._blocks: set[int] = set()
        # Functions whose results a round fetched: their tasks end when theirs is fetched.
        self._fetched_functions: set[str] = set()

    # ------------------------------------------------------------ from the hooks

    def begin(self, input_bundles: Any) -> None:
        self._tracer.guard(self._begin, input_bundles)

    def submitted(
        self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> None:
        self._tracer.guard(self._submitted, fn, args, kwargs, result)

    def awaiting(self, bar: Any, refs: Any) -> None:
        self._tracer.guard(self._begin_awaiting, compat.round_name(bar), len(refs))

    def fetched(self, refs: Any, results: Any, error: BaseException | None) -> None:
        self._tracer.guard(self._fetched, refs, results, error)

    def done(self, error: BaseException | None) -> None:
        self._tracer.guard(self._done, error)

    # ------------------------------------------------------------ the facts

    def _begin(self, input_bundles: Any) -> None:
        self._blocks = compat.ref_keys(compat.block_refs(input_bundles))

    def _submitted(
        self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> None:
        refs = compat.returned_refs(result)
        if not refs:
            return
        ray_task_id = compat.ref_task_id(refs[0])
        if ray_task_id is None:
            return
        call_args, options = compat.submit_call(args, kwargs)
        blocks_in = compat.count_known(call_args, self._blocks)
        self._blocks |= compat.ref_keys(refs)
        index = self._next_index
        self._next_index += 1
        function = compat.function_name(fn)
        task = self._tracer.dispatch(
            self._stage, index, (blocks_in, 0, 0), ray_task_id,
            request=compat.task_request(fn, options),
            args={L.ARG_RAY_FUNCTION: function},
        )
        self._open[ray_task_id] = _Submitted(task, refs, ray_task_id, blocks_in, function)

    def _begin_awaiting(self, name: str, count: int) -> None:
        self._tracer.timeline.begin_loop(
            L.SLICE_AWAITING, {L.ARG_WAITING_FOR: name, L.ARG_TASKS: count}
        )
        self._awaiting += 1

    def _fetched(self, refs: Any, results: Any, error: BaseException | None) -> None:
        if self._awaiting:
            self._awaiting -= 1
            self._tracer.timeline.end_loop()
        now = self._tracer.writer.now()
        if results is not None:
            for ref, result in zip(refs, results, strict=False):
                sub = self._open.pop(compat.ref_task_id(ref) or "", None)
                if sub is not None:
                    self._fetched_functions.add(sub.function)
                    self._end(sub, now, self._io_args(sub, result))
        else:
            # The wait raised: of the tasks it waited for, those finished, each with its
            # error if its result is one (what it fetched is Ray Data's small metadata).
            waited: dict[str, tuple[_Submitted, Any]] = {}
            for ref in refs:
                sub = self._open.get(compat.ref_task_id(ref) or "")
                if sub is not None:
                    waited[sub.ray_task_id] = (sub, ref)
            by_ref = {ref: sub for sub, ref in waited.values()}
            for ref in compat.ready(list(by_ref)):
                sub = self._open.pop(by_ref[ref].ray_task_id)
                args = self._io_args(sub, None)
                failure = compat.task_error(ref)
                if failure is not None:
                    args.update(self._tracer.failure(sub.task, failure, now))
                self._end(sub, now, args)
        self._end_finished(now, everything=error is not None)

    def _done(self, error: BaseException | None) -> None:
        tl = self._tracer.timeline
        while self._awaiting:  # a wait that never returned to its hook
            self._awaiting -= 1
            tl.end_loop()
        now = self._tracer.writer.now()
        self._end_finished(now, everything=True)
        for sub in list(self._open.values()):
            self._end(sub, now, {**self._io_args(sub, None), L.ARG_STATUS: L.STATUS_UNFINISHED})
        self._open.clear()
        self._blocks.clear()
        self._fetched_functions.clear()

    def _end_finished(self, now: int, everything: bool) -> None:
        """End the open tasks Ray has finished whose results no round fetches (a push-based
        shuffle's merges, a split repartition's splits: the others end with their round,
        their output counted); ``everything``: all that finished."""
        by_ref = {
            sub.ref: sub for sub in self._open.values()
            if everything or sub.function not in self._fetched_functions
        }
        for ref in compat.ready(list(by_ref)):
            sub = self._open.pop(by_ref[ref].ray_task_id)
            self._end(sub, now, self._io_args(sub, None))

    def _end(self, sub: _Submitted, now: int, args: dict[str, Any]) -> None:
        self._tracer.end(self._stage, sub.task, now, args)

    @staticmethod
    def _io_args(sub: _Submitted, result: Any) -> dict[str, Any]:
        args: dict[str, Any] = {L.ARG_RAY_TASK_ID: sub.ray_task_id, L.ARG_BLOCKS_IN: sub.blocks_in}
        meta = compat.result_metadata(result)
        if meta is not None:
            rows, size, node_id = meta
            args[L.ARG_BLOCKS_OUT] = max(sub.num_refs - 1, 1)
            if rows is not None:
                args[L.ARG_ROWS_OUT] = rows
            if size is not None:
                args[L.ARG_BYTES_OUT] = size
            if node_id:
                args[L.ARG_NODE_ID] = node_id
        return args

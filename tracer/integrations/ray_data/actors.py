"""Ray Data's actor pools starting: each actor from its creation until Ray Data saw it ready.

An actor-pool operator (``map_batches(SomeClass, concurrency=n)``) creates its
actors as it starts and runs no task until one is ready: the actor's
``__init__`` (a model loaded) is often the longest wait of a pipeline, and
nothing else in the trace shows it. :class:`ActorPoolWatch` wraps two methods
of the operator's pool for one execution (on the instance, as the task hooks
are, given back at its end): ``_add_pending_actor`` (an actor created: its
``actor starting`` slice begins) and ``pending_to_running`` (Ray Data saw it
ready, its ``get_location`` having answered after ``__init__``: the slice
ends, with the node it runs on; an ``__init__`` that raised ends it
``failed`` with the UDF's own error and the actor's pid). The slices are drawn by the run timeline
(:meth:`~tracer.ray.timeline.RunTimeline.actor_starting`) on the stage's
*actors starting* lanes. An actor Ray Data dropped before it was ready (its
pool scaled down) ends ``released`` at the next scheduling step; one still
starting when the execution ended, ``unfinished``.

The actors an operator creates as it starts are created before the
execution's trace is open: they are drawn from the run's start
(``began_before_run_ns`` says by how much; the start hook records when the
operator started). A pool without the parts read here (another Ray:
:func:`._compat.actor_pool`) is not watched: its actors' start is not drawn.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tracer.integrations.ray_data import _compat as compat
from tracer.integrations.ray_data._compat import STARTED_ATTR
from tracer.integrations.ray_data.tasks import Stage, data_error_args, hooked
from tracer.ray import layout as L
from tracer.ray.task_errors import exceptions_in_traceback
from tracer.ray.timeline import ActorStart, RunTimeline

if TYPE_CHECKING:
    from tracer.format import TraceWriter

__all__ = ["STARTED_ATTR", "ActorPoolWatch"]

#: The actor's pid in Ray's header of its creation task's error ("ray::...() (pid=123, ").
_PID_RE = re.compile(r"\(pid=(\d+),")


class ActorPoolWatch:
    """One actor-pool operator's actors starting, for one execution (see the module doc).

    Every method runs under the execution tracer's lock (``guard``).
    """

    def __init__(
        self,
        stage: Stage,
        pool: Any,
        timeline: RunTimeline,
        writer: TraceWriter,
        guard: Callable[..., None],
    ) -> None:
        self.stage = stage
        self.pool = pool
        self._timeline = timeline
        self._writer = writer
        self._guard = guard
        self._open: dict[Any, ActorStart] = {}  # ready ref -> its actor's slice
        #: The pool's methods hooked (on the instance): the execution tracer gives them
        #: back with its other hooks (ExecutionTracer._release).
        self.hooked: list[str] = []

    @classmethod
    def watch(
        cls, stage: Stage, timeline: RunTimeline, writer: TraceWriter,
        guard: Callable[..., None],
    ) -> ActorPoolWatch | None:
        """A watch of ``stage``'s actor pool (its actors already created drawn), or None:
        not an actor pool, or not one this Ray Data's internals let tracer follow."""
        pool = compat.actor_pool(stage.op)
        if pool is None:
            return None
        watch = cls(stage, pool, timeline, writer, guard)
        watch._hook()
        watch._already_created()
        return watch

    # ------------------------------------------------------------ hooks

    def _hook(self) -> None:
        pool, guard = self.pool, self._guard
        add_name = compat.add_pending_name(pool) or compat.ADD_PENDING_ACTOR[0]
        add_original = getattr(pool, add_name)
        ready_original = pool.pending_to_running

        add_pending_actor = hooked(
            add_original, lambda _stage, args, kwargs: self._created(args, kwargs),
            self.stage, guard,
        )

        def pending_to_running(*args: Any, **kwargs: Any) -> Any:
            # 2.60 returns the actor (None: gone before it was ready), 2.50 True or False.
            before = compat.pending_actor_of(pool, args, kwargs)
            try:
                result = ready_original(*args, **kwargs)
            except BaseException as exc:
                guard(self._ready, args, kwargs, None, exc)
                raise
            actor = before if result is True else None if result is False else result
            guard(self._ready, args, kwargs, actor, None)
            return result

        pending_to_running.__tracer_hook__ = True  # type: ignore[attr-defined]
        for name, fn in ((add_name, add_pending_actor),
                         ("pending_to_running", pending_to_running)):
            setattr(pool, name, fn)
            self.hooked.append(name)

    # ------------------------------------------------------------ facts

    def _already_created(self) -> None:
        """The actors the operator created as it started (before the trace was open)."""
        now = self._writer.now()
        started = getattr(self.stage.op, STARTED_ATTR, None)
        ts = started if isinstance(started, int) and started <= now else now
        for ready_ref, actor in compat.pending_actors(self.pool):
            self._begin(ready_ref, actor, ts)
        for actor in compat.running_actors(self.pool):  # ready already (wait_for_min_actors_s)
            start = self._timeline.actor_starting(
                self.stage.stage_id, self.stage.name, ts, _id_args(actor)
            )
            self._timeline.actor_started(start, now, self._ready_args(actor))

    def _begin(self, ready_ref: Any, actor: Any, ts: int) -> None:
        if ready_ref is None or ready_ref in self._open:
            return
        self._open[ready_ref] = self._timeline.actor_starting(
            self.stage.stage_id, self.stage.name, ts, _id_args(actor)
        )

    def _created(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        actor, ready_ref = compat.added_actor(args, kwargs)
        self._begin(ready_ref, actor, self._writer.now())

    def _ready(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], actor: Any,
        error: BaseException | None,
    ) -> None:
        start = self._open.pop(compat.ready_ref_arg(args, kwargs), None)
        if start is None:
            return
        now = self._writer.now()
        if error is not None:
            end: dict[str, Any] = {L.ARG_STATUS: L.STATUS_FAILED, **init_error_args(error)}
        elif actor is None:  # removed from the pool before it was ready
            end = {L.ARG_STATUS: L.STATUS_RELEASED}
        else:
            end = self._ready_args(actor)
        self._timeline.actor_started(start, now, end)

    def _ready_args(self, actor: Any) -> dict[str, Any]:
        node = compat.actor_node(self.pool, actor)
        return {L.ARG_NODE_ID: node} if node else {}

    def check(self) -> None:
        """At a scheduling step: actors Ray Data dropped while they started end ``released``."""
        if not self._open:
            return
        gone = [ref for ref in self._open if not compat.is_pending(self.pool, ref)]
        if not gone:
            return
        now = self._writer.now()
        for ref in gone:
            self._timeline.actor_started(
                self._open.pop(ref), now, {L.ARG_STATUS: L.STATUS_RELEASED}
            )

    def close(self, ts: int) -> None:
        """The execution ended: actors still starting end ``unfinished`` at ``ts``."""
        for start in self._open.values():
            self._timeline.actor_started(start, ts, {L.ARG_STATUS: L.STATUS_UNFINISHED})
        self._open.clear()


def init_error_args(error: BaseException) -> dict[str, Any]:
    """``error_type``, ``error`` (and ``worker_pid``) of an actor whose ``__init__`` raised:
    Ray's ``ActorDiedError`` carries the creation task's traceback, whose last exception
    is the UDF's own ("ValueError: no model at ..."), and the actor's pid."""
    args: dict[str, Any] = dict(data_error_args(error))
    text = str(error)
    raised = exceptions_in_traceback(text)
    if raised:
        error_type, line = raised[-1]
        args.update({L.ARG_ERROR_TYPE: error_type, L.ARG_ERROR: line[:500]})
    pid = _PID_RE.search(text)
    if pid:
        args[L.ARG_WORKER_PID] = int(pid.group(1))
    return args


def _id_args(actor: Any) -> dict[str, Any]:
    actor_id = compat.actor_id(actor)
    return {L.ARG_ACTOR_ID: actor_id} if actor_id else {}

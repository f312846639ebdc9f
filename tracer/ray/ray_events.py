"""Ray's own task events, read for the tracer: the one module that knows Ray's API for them.

Ray records, per task attempt, its scheduling states and, in the worker that
ran it, profile events (``task:deserialize_arguments``, ``task:execute``,
``task:store_outputs`` inside ``task::<name>``), on by default. Workers and
owners buffer them and report them to the GCS every
``RAY_task_events_report_interval_ms`` (1 s by default); the GCS keeps up to
``RAY_task_events_max_num_task_in_gcs`` task attempts (100,000) and counts
what it dropped. ``ray.timeline()`` reads *all* of them.

Where they are read from, best first:

* **the GCS, filtered** (:class:`GcsQuery`): the ``GetTaskEvents`` RPC of
  ``TaskInfoGcsService`` over gRPC (what Ray's state API calls). It takes
  filters, indexed on the GCS side, but several task-id filters are ANDed, so
  a query is either *one task id* (one round trip, ~0.5 ms and ~0.3 ms of CPU
  in the driver and as much in the GCS), *the whole job* (every task the
  driver's job ran, ~1 KB each: ~25 µs of CPU per task sent, most of it in the
  GCS) or *the most recently finished tasks* (:meth:`GcsQuery.recent`, below).
  :class:`RayEventSource` picks the cheapest for the tasks still wanted, by
  the costs it measured.
* **the dashboard head** (:class:`HeadQuery`), when Ray sends task events
  there instead of the GCS (``RAY_enable_task_events_to_dashboard_head``):
  the same request, over HTTP.
* **everything** (:class:`AllEventsQuery`): ``GlobalState._get_all_task_events``
  (what ``ray.timeline()`` uses), filtered here; when neither above works.

Each is private Ray API: every call is guarded, and a source that fails is
replaced by the next, then by none (the trace then says the events are
missing; the run never notices). What comes back is converted to plain facts
(:class:`~tracer.ray.timeline.RayTaskEvents`, by :mod:`tracer.ray.ray_events_facts`),
the only thing the run timeline sees.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from typing import Any, Protocol

from tracer.ray.ray_events_facts import facts_of, to_facts
from tracer.ray.ray_events_wire import split_reply, task_key
from tracer.ray.timeline import RayTaskEvents

logger = logging.getLogger("tracer")

__all__ = [
    "AllEventsQuery",
    "GcsQuery",
    "HeadQuery",
    "RayEventSource",
    "Reply",
]

#: A GCS round trip for one task id, before one was measured (seconds).
_ONE_TASK_COST_S = 0.0006
#: By job id: what reads of the job measured (one task's query s, the job's query s, a
#: recent query's s, the job's tasks Ray held, all tasks Ray held), for the next source
#: of the same job.
_MEASURED: dict[bytes, tuple[float, float | None, float | None, int, int]] = {}
#: A recent read asks for this many task attempts beyond those wanted (other jobs' tasks,
#: retries, ends that reached Ray meanwhile) ...
_RECENT_SLACK = 64
#: ... and asks again, deeper, at most this many times when its limit fell short.
_RECENT_TRIES = 4
#: What a recent read's copy of Ray's storage costs per task held, against a task sent,
#: parsed and converted (the GCS copies ~6 µs a task, a task sent costs ~25 µs).
_COPY_SHARE = 0.25
#: A recent read is for a job that held at least this many times the tasks wanted at the
#: last read (a long-lived driver's: a read of the job would send its earlier runs
#: again), and only until the job is read. In a run's own job, reads of the job send
#: each task ~1.33 times (see worth_reading); recent reads there would re-send, at
#: every read, the tasks found without their worker's events yet (their end came
#: first): about a second's worth of tasks, deeper each time. Measured on 2000-task
#: runs, that sent 2.4 times the run.
_RECENT_RATIO = 1
#: Ray's cap on the task attempts its GCS keeps, and its default.
_ENV_RAY_CAP = "RAY_task_events_max_num_task_in_gcs"
_RAY_CAP_DEFAULT = 100_000
class Reply:
    """What one read brought: events of task attempts, and what Ray says it dropped."""

    __slots__ = ("dropped", "events", "stored", "truncated")

    def __init__(
        self, events: list[Any], dropped: int, stored: int = 0, truncated: int = 0
    ) -> None:
        #: Ray's TaskEvents protos, or entries of a reply not parsed yet
        #: (:data:`~tracer.ray.ray_events_wire.RawTaskEvents`; ``task_key`` reads
        #: either's id and attempt, :func:`to_facts` parses what it keeps).
        self.events = events
        self.dropped = dropped  # profile + status events Ray dropped (for the job, or in all)
        #: Task attempts Ray holds for the query (a job query: the job's), sent or not.
        self.stored = stored
        #: Task attempts the query's limit left out (a recent query: the older ones).
        self.truncated = truncated


class Query(Protocol):
    """One way of reading Ray's task events."""

    name: str

    def job(self, job_id: bytes, timeout: float) -> Reply: ...

    def task(self, task_id: bytes, timeout: float) -> Reply: ...

    def close(self) -> None: ...


def ray_cap() -> int:
    """Task attempts Ray's GCS keeps (``RAY_task_events_max_num_task_in_gcs``, all jobs).

    Read from the driver's environment, which a local cluster's GCS
    inherits; a remote GCS's setting cannot be asked for, and Ray's default
    stands in for it.
    """
    raw = os.environ.get(_ENV_RAY_CAP, "").strip()
    try:
        cap = int(raw) if raw else _RAY_CAP_DEFAULT
    except ValueError:
        cap = _RAY_CAP_DEFAULT
    return cap if cap > 0 else _RAY_CAP_DEFAULT


def _task_id_bytes() -> int:
    """The size of Ray's task ids (24 bytes in Ray 2.x)."""
    global _TASK_ID_BYTES
    if _TASK_ID_BYTES is None:
        try:
            import ray

            _TASK_ID_BYTES = int(ray.TaskID.size())
        except Exception:
            _TASK_ID_BYTES = 24
    return _TASK_ID_BYTES


_TASK_ID_BYTES: int | None = None


def _request(job_id: bytes | None, task_id: bytes | None, limit: int | None = None) -> Any:
    from ray.core.generated import gcs_service_pb2 as gs

    filters = gs.GetTaskEventsRequest.Filters()
    if limit is not None:  # a recent query: no index, so Ray's storage order and the limit hold
        filters.exclude_driver = True
        return gs.GetTaskEventsRequest(filters=filters, limit=limit)
    if task_id is not None:
        filters.task_filters.append(
            gs.GetTaskEventsRequest.Filters.TaskIdFilter(task_id=task_id, predicate=0)
        )
    if job_id is not None:
        filters.job_filters.append(
            gs.GetTaskEventsRequest.Filters.JobIdFilter(job_id=job_id, predicate=0)
        )
    return gs.GetTaskEventsRequest(filters=filters)


def _reply(reply: Any, events: list[Any] | None = None) -> Reply:
    if reply.status.code != 0:
        raise RuntimeError(f"task events query rejected: {reply.status.message}")
    dropped = int(reply.num_profile_task_events_dropped) + int(reply.num_status_task_events_dropped)
    if events is None:
        events = list(reply.events_by_task)
    return Reply(events, dropped, int(reply.num_total_stored), int(reply.num_truncated))


def _reply_of(data: bytes) -> Reply:
    """A reply's bytes as a :class:`Reply` whose task entries are parsed only when wanted
    (:mod:`tracer.ray.ray_events_wire`); bytes it cannot split are parsed whole."""
    try:
        header, entries = split_reply(data)
    except ValueError as exc:
        logger.debug("tracer: Ray's task events reply parsed whole: %s", exc)
        from ray.core.generated import gcs_service_pb2 as gs

        return _reply(gs.GetTaskEventsReply.FromString(data))
    return _reply(header, entries)


class GcsQuery:
    """The GCS's ``GetTaskEvents`` RPC, filtered by job or by task id."""

    name = "gcs"

    def __init__(self, gcs_address: str) -> None:
        import grpc  # type: ignore[import-untyped]  # noqa: F401  (first: Ray installs it only with its extras)
        from ray._private import ray_constants

        try:
            from ray._private.grpc_utils import init_grpc_channel
        except ImportError:  # Ray 2.50: in ray._private.utils
            from ray._private.utils import init_grpc_channel
        from ray.core.generated import gcs_service_pb2 as gs

        # gRPC's default cap on a reply is 4 MiB, about 4,700 tasks of a job: a bigger job's
        # read failed and fell back to reading every job's events. Ray's state API lifts it
        # to Ray's own cap (512 MiB: more than the 100,000 task attempts Ray keeps).
        limit = int(getattr(ray_constants, "GRPC_CPP_MAX_MESSAGE_SIZE", 512 * 1024 * 1024))
        options = [
            *ray_constants.GLOBAL_GRPC_OPTIONS,
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ]
        self._channel = init_grpc_channel(gcs_address, options, asynchronous=False)
        # The stub's method with the reply left as bytes (see _reply_of).
        method = gs.DESCRIPTOR.services_by_name["TaskInfoGcsService"].methods_by_name[
            "GetTaskEvents"
        ]
        self._get = self._channel.unary_unary(
            f"/{method.containing_service.full_name}/{method.name}",
            request_serializer=gs.GetTaskEventsRequest.SerializeToString,
            response_deserializer=None,
        )

    def job(self, job_id: bytes, timeout: float) -> Reply:
        return _reply_of(self._get(_request(job_id, None), timeout=timeout))

    def task(self, task_id: bytes, timeout: float) -> Reply:
        return _reply_of(self._get(_request(None, task_id), timeout=timeout))

    def recent(self, limit: int, timeout: float) -> Reply:
        """The ``limit`` task attempts (of any job) that finished last, newest first.

        Without a job or task filter the GCS walks its storage itself, and
        that storage is kept in lists by eviction priority, each newest
        first: finished tasks first, in the order their end reached the
        GCS (a later event of a finished task merges in place), then
        unfinished actor tasks, then the rest. The limit then cuts what is
        sent and parsed to about the tasks wanted, whatever the job's
        history: in a driver whose job already ran 30,000 tasks, a read of
        2,000 costs the driver ~6 ms instead of ~150 ms, and the GCS ~0.2 s
        instead of ~0.6 s (it still copies its whole storage once, ~6 µs a
        task). The order is Ray's storage detail, not its API:
        :class:`RayEventSource` never relies on it for what it draws, only
        for how much it reads, and reads the job when a recent read leaves
        out tasks it needs.
        """
        return _reply_of(self._get(_request(None, None, limit), timeout=timeout))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._channel.close()


class HeadQuery:
    """The dashboard head's task-events route (Ray sends the events there, not to the GCS)."""

    name = "dashboard"

    def __init__(self) -> None:
        import ray._private.state as state

        self._client = state.TaskEventsHeadClient(_state_accessor())

    def _post(self, request: Any, timeout: float) -> Reply:
        from ray._private.authentication.http_token_authentication import (
            get_auth_headers_if_auth_enabled,
        )

        headers = {"Content-Type": "application/octet-stream"}
        headers.update(get_auth_headers_if_auth_enabled(headers))
        response = self._client._session.post(
            self._client._get_endpoint(), data=request.SerializeToString(), headers=headers,
            timeout=timeout,
        )
        if not 200 <= response.status_code < 300:
            raise RuntimeError(f"dashboard head answered HTTP {response.status_code}")
        return _reply_of(response.content)

    def job(self, job_id: bytes, timeout: float) -> Reply:
        return self._post(_request(job_id, None), timeout)

    def task(self, task_id: bytes, timeout: float) -> Reply:
        return self._post(_request(None, task_id), timeout)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close()


class AllEventsQuery:
    """Every task event Ray holds (``ray.timeline()``'s read), filtered here: the last resort."""

    name = "all"

    def _all(self) -> list[Any]:
        import ray._private.state as state

        read_all = getattr(state.state, "_get_all_task_events", None)
        if read_all is not None:  # Ray 2.60 has it, 2.55 not
            return list(read_all())
        # Before it, ray.timeline() parsed the GCS accessor's serialized events itself.
        from ray.core.generated import gcs_pb2

        accessor = _state_accessor()
        return [gcs_pb2.TaskEvents.FromString(data) for data in accessor.get_task_events()]

    def job(self, job_id: bytes, timeout: float) -> Reply:
        events = [e for e in self._all() if e.job_id == job_id]
        return Reply(events, 0, len(events))

    def task(self, task_id: bytes, timeout: float) -> Reply:
        return Reply([e for e in self._all() if e.task_id == task_id], 0)

    def close(self) -> None:
        pass


def _state_accessor() -> Any:
    """Ray's connected ``GlobalStateAccessor`` (2.50 keeps it on ``GlobalState`` once
    ``_check_connected`` made it; later Rays hand it out by ``_connect_and_get_accessor``)."""
    import ray._private.state as state

    connect = getattr(state.state, "_connect_and_get_accessor", None)
    if connect is not None:
        return connect()
    state.state._check_connected()
    return state.state.global_state_accessor


def _sources() -> list[Query]:
    """The ways this Ray can be read, best first (those that cannot even start are left out)."""
    import ray

    found: list[Query] = []
    to_head = False
    with contextlib.suppress(Exception):
        to_head = bool(ray._config.enable_task_events_to_dashboard_head())
    if to_head:
        with contextlib.suppress(Exception):
            found.append(HeadQuery())
    else:
        try:
            found.append(GcsQuery(ray.get_runtime_context().gcs_address))
        except Exception as exc:
            _warn_no_gcs_query(exc)
    found.append(AllEventsQuery())
    return found


_warned_no_gcs_query = False


def _warn_no_gcs_query(exc: Exception) -> None:
    """Say once per process why Ray's events are read the slow way: a long-lived driver's
    reads then cost it every task Ray holds, of every job, and nothing else would tell."""
    global _warned_no_gcs_query
    if _warned_no_gcs_query:
        return
    _warned_no_gcs_query = True
    hint = " (pip install grpcio)" if isinstance(exc, ImportError) else ""
    logger.warning(
        "tracer: Ray's task events cannot be read from the GCS (%s: %s)%s; reading every "
        "task event Ray holds instead, which costs more the more tasks Ray keeps",
        type(exc).__name__, exc, hint,
    )


def _timed_out(exc: BaseException) -> bool:
    """A read that ran out of time (gRPC's DEADLINE_EXCEEDED, a timeout of ours)."""
    if isinstance(exc, TimeoutError):
        return True
    code = getattr(exc, "code", None)
    try:
        return callable(code) and getattr(code(), "name", None) == "DEADLINE_EXCEEDED"
    except Exception:
        return False


_said_fallback: set[tuple[str, str]] = set()


def _say_fallback(failed: str, then: str, exc: BaseException) -> None:
    """Once per process and pair: Ray's events are read another, costlier way from now on
    (it was said only at DEBUG, and the traces went on lacking events)."""
    if (failed, then) in _said_fallback:
        return
    _said_fallback.add((failed, then))
    logger.warning(
        "tracer: reading Ray's task events from %s failed (%s: %s); reading them from %s "
        "from now on in this run%s", failed, type(exc).__name__, str(exc)[:200], then,
        " (every event Ray holds: it costs more the more tasks Ray keeps)"
        if then == AllEventsQuery.name else "",
    )


class RayEventSource:
    """Reads the Ray events of given task ids, the cheapest way it has measured.

    Per read, one query per task id costs about ``n x`` a round trip, one
    query of the job costs what the job's stored events cost to send and
    parse (it grows with every task the job ran, up to Ray's cap). Both costs
    are measured as they happen, and each read takes the cheaper. A job that
    already held as many tasks as are wanted (a long-lived driver's later
    runs) is read by what finished last instead (:meth:`GcsQuery.recent`,
    :data:`_RECENT_RATIO`), until the job is read. A source that raises is
    dropped for the next one.
    """

    def __init__(self, job_id: str, queries: Sequence[Query] | None = None) -> None:
        self.job_id = bytes.fromhex(job_id)
        self._queries: list[Query] = list(queries) if queries is not None else _sources()
        # What earlier runs of the driver measured of its job (a long-lived driver's job
        # holds every earlier run's tasks: a first query of it can take seconds).
        self._one_task_s, self._job_s, self._recent_s, stored, held = _MEASURED.get(
            self.job_id, (_ONE_TASK_COST_S, None, None, 0, 0)
        )
        #: Seconds the last read took (the channel spaces reads by it).
        self.last_cost_s = 0.0
        #: The name of the query the last read succeeded with ("": none yet).
        self.read_from = ""
        #: Events Ray says it dropped (the most any reply said).
        self.dropped = 0
        #: Task attempts of the job Ray holds: as the last job query said, plus the new
        #: ones recent queries found since. 0: none read yet.
        self.stored = stored
        #: Task attempts of every job Ray held at the last recent query (0: none yet).
        self.held = held
        # Where the last recent read found the tasks it was asked for (positions in Ray's
        # newest-first order), and which task attempt came first: a task still wanted is
        # now deeper by what finished since (see _recent_limit).
        self._depth: dict[str, int] = {}
        self._front: tuple[bytes, int] | None = None
        self._read_job = False  # once the job was read, it is read again (see _RECENT_RATIO)

    @classmethod
    def for_current_job(cls) -> RayEventSource | None:
        """A source for the driver's Ray job; None when Ray is not initialised."""
        try:
            import ray

            if not ray.is_initialized():
                return None
            return cls(ray.get_runtime_context().get_job_id())
        except Exception:
            return None

    @property
    def name(self) -> str:
        return self._queries[0].name if self._queries else "none"

    def worth_reading(self, wanted: int, share: float) -> bool:
        """Would a read of ``wanted`` tasks now be mostly of them (at least ``share``)?

        A query of the job sends its stored tasks at the last query plus
        those wanted since (new ones, most of them), up to what Ray keeps
        (:func:`ray_cap`). Reading only when the tasks wanted are ``share`` of
        that, the job sent grows ``1 / (1 - share)``-fold between reads, so
        every task of a run is sent about ``1 / share`` times however long the
        run (``share`` 0.75: 1.33 times, the close's read included), instead of
        once per read. Once the job is at Ray's cap it stops growing: then a
        read is due when half of what Ray keeps is wanted, so that what Ray
        drops to keep its cap (the oldest finished tasks first) has been read.
        One query per task sends only what is wanted, but costs ~15x a task's
        share of a job query (a round trip each): not a reason to read early
        either; what is left is read at the close, the cheaper way.

        A recent query (:meth:`GcsQuery.recent`) sends about what is wanted,
        but has the GCS copy all it holds: that copy counts as a quarter of a
        task sent per task held.
        """
        cap = ray_cap()
        if self._queries and self._recent_for(self._queries[0], wanted) is not None:
            sent = wanted + int(_COPY_SHARE * min(self.held or self.stored, cap))
        else:
            sent = min(self.stored + wanted, cap)
        return wanted > 0 and (wanted >= share * sent or wanted >= cap // 2)

    def read(
        self, task_ids: Sequence[str], timeout: float = 5.0, complete: bool = False
    ) -> list[RayTaskEvents]:
        """Ray's events of these tasks (hex ids), as facts; [] when none can be read.

        ``complete``: Ray should have them all by now (the close, once its probes
        came): a recent read that leaves some out is followed by a read of the
        job. Otherwise the tasks it left out are left for a later read.
        """
        return self._guarded(task_ids, timeout, each=False, complete=complete)

    def read_each(self, task_ids: Sequence[str], timeout: float = 5.0) -> list[RayTaskEvents]:
        """Like :meth:`read`, with one query per task whatever the costs (a few tasks)."""
        return self._guarded(task_ids, timeout, each=True, complete=False)

    def _guarded(
        self, task_ids: Sequence[str], timeout: float, each: bool, complete: bool
    ) -> list[RayTaskEvents]:
        if not task_ids:
            return []
        wanted = set(task_ids)
        while self._queries:
            query = self._queries[0]
            t0 = time.perf_counter()
            try:
                events = self._read(query, task_ids, wanted, timeout, each, complete)
            except Exception as exc:
                if _timed_out(exc):
                    # A busy GCS, not a missing one: this read brings nothing (its tasks
                    # are asked again at the next), and the source stays. Dropping it
                    # sent every later read to the last resort, a read of every event
                    # Ray holds that no timeout bounds (a quarter of the traces of a
                    # loaded driver).
                    logger.debug("tracer: Ray's task events from %s timed out: %s",
                                 query.name, exc)
                    return []
                self._queries.pop(0).close()
                if self._queries:
                    _say_fallback(query.name, self._queries[0].name, exc)
                else:
                    logger.debug("tracer: Ray's task events from %s failed: %s",
                                 query.name, exc)
                continue
            self.last_cost_s = time.perf_counter() - t0
            self.read_from = query.name
            _MEASURED[self.job_id] = (
                self._one_task_s, self._job_s, self._recent_s, self.stored, self.held
            )
            return events
        return []

    def _read(
        self, query: Query, task_ids: Sequence[str], wanted: set[str], timeout: float,
        each: bool,
        complete: bool,
    ) -> list[RayTaskEvents]:
        per_task = self._one_task_s * len(task_ids)
        recent = self._recent_for(query, len(task_ids))
        many_s = self._recent_s if recent is not None else self._job_s
        if each or (many_s is not None and per_task < many_s):
            # Only ids of Ray's size: the GCS checks a task id's size with an assertion
            # that stops the GCS (and so the cluster) when it fails.
            task_ids = [t for t in task_ids if len(t) == 2 * _task_id_bytes()]
            t0 = time.perf_counter()
            found: list[Any] = []
            deadline = t0 + timeout
            for task_id in task_ids:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                reply = query.task(bytes.fromhex(task_id), remaining)
                found.extend(reply.events)
                self.dropped = max(self.dropped, reply.dropped)
            self._one_task_s = (time.perf_counter() - t0) / max(1, len(task_ids))
            return to_facts(found, wanted)
        if recent is not None:
            try:
                facts, covered = self._read_recent(recent, wanted, timeout, complete)
            except Exception as exc:  # a Ray whose GCS takes no limit, say: the job, from now
                logger.debug("tracer: a recent read of Ray's task events failed: %s", exc)
            else:
                if covered or not complete:
                    return facts
        self._read_job = True
        t0 = time.perf_counter()
        reply = query.job(self.job_id, timeout)
        self._job_s = time.perf_counter() - t0
        self.dropped = max(self.dropped, reply.dropped)
        self.stored = reply.stored or len(reply.events)
        return to_facts(reply.events, wanted)

    def _recent_for(self, query: Query, wanted: int) -> Any:
        """The query's recent read when it is the one to use for ``wanted`` tasks, else None."""
        recent = getattr(query, "recent", None)
        if recent is None or self._read_job or self.stored < _RECENT_RATIO * wanted:
            return None
        # It copies all Ray holds, of every job; a read of the job sends the job's.
        if _COPY_SHARE * (self.held or self.stored) >= self.stored:
            return None
        return recent

    def _read_recent(
        self, recent: Any, wanted: set[str], timeout: float, complete: bool
    ) -> tuple[list[RayTaskEvents], bool]:
        """The tasks that finished last, deep enough for those wanted; the facts of those
        wanted, and whether every one was there or the read saw all Ray holds.

        ``complete``: Ray should have them all, so one missing is deeper than the
        limit (others' tasks finished among them: an earlier run's last ends,
        reported a second late, or another job's): the read asks again, twice as
        deep, a few times.
        """
        t0 = time.perf_counter()
        deadline = t0 + timeout
        prior = [self._depth[t] for t in wanted if t in self._depth]
        # Those not found before finished since, most of them: in front of those found.
        limit = len(wanted) - len(prior) + (max(prior) + 1 if prior else 0) + _RECENT_SLACK
        for _ in range(_RECENT_TRIES):
            reply = recent(limit, max(0.001, deadline - time.perf_counter()))
            ids = [task_key(ev)[0].hex() for ev in reply.events]
            shift = self._shift(reply)
            if not reply.truncated:
                break
            if prior and shift is not None and shift < 0:  # more than the limit finished
                # Ray holds that many more tasks now (less what it evicted meanwhile).
                since = reply.stored - self.held
                needed = max(2 * limit, since + max(prior) + 1 + _RECENT_SLACK)
            elif prior and shift is not None:  # each is deeper by what finished since
                needed = shift + max(prior) + 1 + _RECENT_SLACK
            else:
                needed = limit
            if needed <= limit and complete and not wanted.issubset(ids):
                needed = 2 * limit
            if needed <= limit:
                break
            limit = needed
        self._recent_s = time.perf_counter() - t0
        self.dropped = max(self.dropped, reply.dropped)
        self.held = reply.stored or len(reply.events)
        picked: list[tuple[Any, str]] = []
        depth: dict[str, int] = {}
        for i, (task_id, ev) in enumerate(zip(ids, reply.events, strict=True)):
            if task_id in wanted:
                depth[task_id] = i
                picked.append((ev, task_id))
        facts = facts_of(picked)
        found = len(depth)
        self.stored += sum(1 for task_id in depth if task_id not in self._depth)  # new ones
        # Those found before and not now (past the limit) are deeper by what finished since.
        moved = len(reply.events) if shift is None or shift < 0 else shift
        for task_id, i in self._depth.items():
            if task_id in wanted and task_id not in depth:
                depth[task_id] = i + moved
        if reply.events:
            self._front = task_key(reply.events[0])
        self._depth = depth
        return facts, found >= len(wanted) or not reply.truncated

    def _shift(self, reply: Reply) -> int | None:
        """How many tasks finished since the last recent read: where its first task is now.

        Ray keeps a finished task where its end put it, and puts every task that
        finishes later in front of it: a task found at position ``i`` last time
        is now at ``i`` plus that. -1: the last read's first task is past this
        reply's limit (more than the limit finished since); None: no last read.
        """
        if self._front is None:
            return None
        front = self._front
        for i, ev in enumerate(reply.events):
            if task_key(ev) == front:
                return i
        return -1

    def close(self) -> None:
        for query in self._queries:
            query.close()
        self._queries = []

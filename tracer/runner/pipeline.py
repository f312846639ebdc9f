"""A reference runner: map-only partition pipelines on Ray, traced.

It exists so that examples, tests and users have a real dispatch loop to
trace, shaped like the Ray runners of dataframe engines: in waves it polls a
plan for ready tasks (a task is ready when its upstream partition is done),
batches them up to what the cluster can take, dispatches them with their
resource requests, waits with ``ray.wait`` and records completions. It uses
only the public API of :mod:`tracer.ray`.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import ray

from tracer.errors import add_note
from tracer.ray import (
    RayFunctionWrapper,
    ResourceRequest,
    TracingLevel,
    new_execution_id,
    ray_tracer,
)
from tracer.runner.progress import Progress

if TYPE_CHECKING:
    from tracer.ray import AnyRunnerTracer


@dataclasses.dataclass(frozen=True)
class Stage:
    """One map stage: ``fn`` is applied to every partition, each call a Ray task.

    The resource request is passed to Ray as ``num_cpus``, ``num_gpus`` and
    ``memory`` (a logical reservation Ray schedules by but never enforces).
    ``max_retries`` and ``retry_exceptions`` are Ray's: how often a task whose
    worker died is retried, and whether (True, or a list of exception types)
    a task that raised is retried too. A traced run with a stage that retries
    exceptions starts the execution's metrics actor, so that attempts that
    raised and were retried show in the trace (see :mod:`tracer.ray.task_metrics`).
    """

    name: str
    fn: Callable[[Any], Any]
    num_cpus: float = 1.0
    num_gpus: float | None = None
    memory_bytes: int | None = None
    max_retries: int | None = None
    retry_exceptions: bool | Sequence[type[BaseException]] = False
    _resource_request: ResourceRequest = dataclasses.field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.retry_exceptions, bool):  # a tuple: the stage stays hashable
            object.__setattr__(self, "retry_exceptions", tuple(self.retry_exceptions))
        if not callable(self.fn):
            raise TypeError(f"stage {self.name!r}: fn must be callable, got {self.fn!r}")
        if not isinstance(self.name, str):  # Ray takes only a string as a task's name
            raise TypeError(f"a stage's name must be a string, got {self.name!r}")
        if not self.name:
            raise ValueError("a stage needs a name")
        # Validated, and built once: the dispatch loop hands it to the tracer for every task.
        request = ResourceRequest(self.num_cpus, self.num_gpus, self.memory_bytes)
        object.__setattr__(self, "_resource_request", request)

    @property
    def resource_request(self) -> ResourceRequest:
        return self._resource_request


    @property
    def ray_options(self) -> dict[str, Any]:
        """The options of this stage's Ray tasks."""
        options = self.resource_request.ray_options()
        if self.max_retries is not None:
            options["max_retries"] = self.max_retries
        if self.retry_exceptions:
            retry = self.retry_exceptions
            options["retry_exceptions"] = retry if isinstance(retry, bool) else list(retry)
        return options


class UnsatisfiableResourcesError(ValueError):
    """A stage asks for more than any node of the cluster has: it could never run."""


class PipelineTimeoutError(TimeoutError):
    """The run took longer than its ``timeout``: its tasks in flight were cancelled."""


@dataclasses.dataclass
class _Task:
    task_id: str
    stage_index: int
    partition: int
    input: Any


def _run_stage(
    fn: Callable[[Any], Any], stage_name: str, partition: int, data: Any, is_source: bool
) -> Any:
    """The body of every task: make the partition if needed, apply the stage."""
    try:
        if is_source and callable(data):
            data = data()
        return fn(data)
    except Exception as exc:
        add_note(exc, f"in stage {stage_name!r}, partition {partition}")
        raise


_run_stage_remote = ray.remote(_run_stage)


class _Plan:
    """Which tasks are ready: downstream tasks of finished partitions first, then new ones."""

    def __init__(self, partitions: Iterable[Any], stages: Sequence[Stage]) -> None:
        self._source: Iterator[Any] = iter(partitions)
        self._stages = stages
        self._next_partition = 0
        self._ready: collections.deque[_Task] = collections.deque()
        self.source_done = False

    def peek(self) -> _Task | None:
        if self._ready:
            return self._ready[0]
        if self.source_done:
            return None
        try:
            data = next(self._source)
        except StopIteration:
            self.source_done = True
            return None
        index = self._next_partition
        self._next_partition += 1
        task = _Task(f"0-{index}", 0, index, data)
        self._ready.append(task)
        return task

    def pop(self) -> _Task:
        return self._ready.popleft()

    def upstream_done(self, task: _Task, ref: Any) -> None:
        nxt = task.stage_index + 1
        if nxt < len(self._stages):
            self._ready.appendleft(_Task(f"{nxt}-{task.partition}", nxt, task.partition, ref))

    @property
    def partitions_seen(self) -> int:
        return self._next_partition


@dataclasses.dataclass
class Pipeline:
    """Input partitions followed by map stages.

    ``partitions`` is a list of partition values, or any iterable (e.g. a
    generator) whose items are partitions or zero-argument *factories* that
    build a partition inside the first stage's task (so big inputs are made
    on the workers, not shipped from the driver).
    """

    partitions: Iterable[Any]
    stages: Sequence[Stage]

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a pipeline needs at least one stage")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")

    def run(
        self,
        *,
        tracing_level: int | str | TracingLevel | None = None,
        trace_path: str | Path | None = None,
        execution_id: str | None = None,
        progress: bool | None = None,
        max_inflight: int | None = None,
        wait_timeout: float = 0.1,
        fetch: bool = True,
        runner_name: str = "pipeline",
        timeout: float | None = None,
    ) -> list[Any]:
        """Run on the current Ray cluster (``ray.init`` first); results in partition order.

        ``tracing_level`` defaults to ``$TRACER_ENABLE_RAY_TRACING``. With
        ``fetch=False`` the results are ObjectRefs. ``progress`` shows a bar
        per stage (default: only when stderr is a terminal). An exception in a
        stage function reaches the caller as that exception, with a note
        naming the stage and partition. With ``timeout`` (seconds), a run still
        going after that long cancels its tasks in flight (``ray.cancel``; the
        trace shows them cancelled) and raises :class:`PipelineTimeoutError`.
        """
        if not ray.is_initialized():
            raise RuntimeError("Ray is not initialised: call ray.init() before Pipeline.run()")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        execution_id = execution_id or new_execution_id()
        deadline = None if timeout is None else time.monotonic() + timeout
        with ray_tracer(
            execution_id, runner_name=runner_name, level=tracing_level, path=trace_path,
            metrics_actor=any(s.retry_exceptions for s in self.stages),
        ) as tracer:
            self.trace_path = tracer.trace_path
            refs = _DispatchLoop(
                self, tracer, progress, max_inflight, wait_timeout, deadline
            ).run()
        if not fetch:
            return refs
        return _fetch(refs)


def _fetch(refs: list[Any]) -> list[Any]:
    try:
        return list(ray.get(refs))
    except ray.exceptions.RayTaskError as err:
        _raise_task_error(err)


def _raise_task_error(err: BaseException) -> NoReturn:
    """Raise a failed task's error as the caller sees it: a stage's own exception unwrapped."""
    cause = getattr(err, "cause", None)
    if isinstance(err, ray.exceptions.RayTaskError) and isinstance(cause, BaseException):
        raise cause from None
    raise err


class _DispatchLoop:
    def __init__(
        self,
        pipeline: Pipeline,
        tracer: AnyRunnerTracer,
        progress: bool | None,
        max_inflight: int | None,
        wait_timeout: float,
        deadline: float | None = None,
    ) -> None:
        self.stages = list(pipeline.stages)
        self.deadline = deadline
        self.plan = _Plan(pipeline.partitions, self.stages)
        self.tracer = tracer
        self.wait_timeout = wait_timeout
        totals = ray.cluster_resources()
        self.total_cpus = float(totals.get("CPU", 0.0))
        self.total_gpus = float(totals.get("GPU", 0.0))
        self.total_mem = float(totals.get("memory", 0.0))
        _check_satisfiable(self.stages)
        _check_picklable(self.stages)
        cap = max_inflight if max_inflight is not None else max(1, 2 * math.ceil(self.total_cpus))
        self.max_inflight = max(1, cap)
        self.used = [0.0, 0.0, 0.0]
        self.inflight: dict[Any, _Task] = {}
        self.received = [0] * len(self.stages)
        known = len(pipeline.partitions) if isinstance(pipeline.partitions, Sequence) else None
        show = progress if progress is not None else sys.stderr.isatty()
        self.progress = Progress([s.name for s in self.stages], known, enabled=show)
        self.functions = [
            RayFunctionWrapper.wrap(_run_stage_remote).options(name=s.name, **s.ray_options)
            for s in self.stages
        ]
        self.results: dict[int, Any] = {}
        # Failed tasks' errors by partition (traced runs only): the run raises the first
        # partition's, as an untraced run's ray.get of the results in order does, not
        # whichever failure the tracer found first.
        self.failures: dict[int, BaseException] = {}
        self.done: set[int] = set()  # stages reported done

    def _fits(self, stage: Stage, pending: int) -> bool:
        """Whether one more task of ``stage`` fits next to ``pending`` dispatched ones."""
        if not pending:
            return True  # always make progress, even when one task is bigger than the cluster
        if pending >= self.max_inflight:
            return False
        cpus = self.used[0] + (stage.num_cpus or 0)
        gpus = self.used[1] + (stage.num_gpus or 0)
        mem = self.used[2] + (stage.memory_bytes or 0)
        return (
            (not self.total_cpus or cpus <= self.total_cpus + 1e-9)
            and (not stage.num_gpus or gpus <= self.total_gpus + 1e-9)
            and (not stage.memory_bytes or mem <= self.total_mem)
        )

    def _account(self, stage: Stage, sign: int) -> None:
        self.used[0] += sign * (stage.num_cpus or 0)
        self.used[1] += sign * (stage.num_gpus or 0)
        self.used[2] += sign * (stage.memory_bytes or 0)

    def run(self) -> list[Any]:
        tracer = self.tracer
        try:
            for wave in itertools.count():
                if self.plan.source_done and not self.inflight and self.plan.peek() is None:
                    break
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self._cancel_inflight()
                with tracer.dispatch_wave(wave) as wave_metrics:
                    batch = self._batch()
                    self._dispatch(batch)
                    done = self._await()
                    wave_metrics(dispatched=len(batch), received=done, inflight=len(self.inflight))
            # The last tasks' failures, so that the run raises while still traced.
            self._failed(tracer.complete_received())
        finally:
            self.progress.close()
        if self.failures:
            _raise_task_error(self.failures[min(self.failures)])
        n = self.plan.partitions_seen
        return [self.results[i] for i in range(n)]

    def _failed(self, errors: dict[str, BaseException]) -> None:
        """Keep each partition's first failure (task ids are ``<stage>-<partition>``)."""
        for task_id, error in errors.items():
            self.failures.setdefault(int(task_id.rsplit("-", 1)[1]), error)

    def _cancel_inflight(self) -> NoReturn:
        """Past the deadline: cancel every task in flight, then give up."""
        tracer = self.tracer
        cancelled = len(self.inflight)
        for ref, task in self.inflight.items():
            ray.cancel(ref)  # asynchronous; a running task stops at its next bytecode
            tracer.task_cancelled(task.task_id)
        self.inflight.clear()
        tracer.count_inflight_tasks(0)
        raise PipelineTimeoutError(
            f"the pipeline did not finish within its timeout; {cancelled} task(s) in flight "
            f"were cancelled, {sum(self.received)} had finished"
        )

    def _batch(self) -> list[_Task]:
        tracer = self.tracer
        batch: list[_Task] = []
        with tracer.dispatch_batching():
            while True:
                with tracer.get_next_physical_plan() as update:
                    task = self.plan.peek()
                    pending = len(self.inflight) + len(batch)
                    if task is not None and not self._fits(self.stages[task.stage_index], pending):
                        update(next_item_type="blocked on resources")
                        break
                    if task is None:
                        update(next_item_type="none")
                    else:
                        self.plan.pop()
                        stage = self.stages[task.stage_index]
                        tracer.task_created(
                            task.task_id, task.stage_index, stage.resource_request,
                            stage.name, stage_name=stage.name,
                        )
                        update(next_item_type="task")
                if task is None:
                    tracer.mark_handle_none_task()
                    break
                tracer.mark_handle_task_add_to_batch()
                batch.append(task)
                self._account(self.stages[task.stage_index], +1)
        return batch

    def _dispatch(self, batch: list[_Task]) -> None:
        if not batch:
            return
        tracer = self.tracer
        with tracer.dispatching():
            for task in batch:
                fn = self.functions[task.stage_index].with_tracing(tracer, task.task_id)
                ref = fn.remote(
                    self.stages[task.stage_index].fn,
                    self.stages[task.stage_index].name,
                    task.partition,
                    task.input,
                    task.stage_index == 0,
                )
                task.input = None  # the ref is all we keep: nothing pinned twice
                self.inflight[ref] = task
                tracer.mark_dispatch_task()
        tracer.count_inflight_tasks(len(self.inflight))

    def _await(self) -> int:
        if not self.inflight:
            return 0
        tracer = self.tracer
        refs = list(self.inflight)
        with tracer.awaiting(1, self.wait_timeout) as update:
            ready, rest = ray.wait(refs, num_returns=1, timeout=self.wait_timeout)
            if ready and rest:
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                ready.extend(more)
            update(num_ready=len(ready))
        last = len(self.stages) - 1
        # Traced, the tasks' small measurements returns (fetched by the tracer
        # for many tasks at once) say which failed: an exception, an OOM kill,
        # a crashed worker. The tracer records them where they ran and reports
        # them, possibly a few waves later; the run raises the first partition's failure
        # once the other partitions are done. A failed partition needs no
        # special care meanwhile: Ray fails its downstream tasks with the same
        # error without running them. Untraced (level 0) this costs nothing:
        # errors surface at the final ray.get.
        tasks = [self.inflight.pop(ref) for ref in ready]
        self._failed(tracer.tasks_received_as_ready([t.task_id for t in tasks]))
        for ref, task in zip(ready, tasks, strict=True):
            index = task.stage_index
            self._account(self.stages[index], -1)
            self.received[index] += 1
            self.progress.update(index, self.received[index])
            if index == last:
                self.results[task.partition] = ref
                tracer.mark_handle_materialized_result()
            self.plan.upstream_done(task, ref)
            self._maybe_stage_done(index)
        tracer.count_inflight_tasks(len(self.inflight))
        return len(ready)

    def _maybe_stage_done(self, index: int) -> None:
        done = self.received[index]
        if self.plan.source_done and done == self.plan.partitions_seen and index not in self.done:
            self.done.add(index)
            self.tracer.stage_done(index)


def _check_picklable(stages: Sequence[Stage]) -> None:
    """Fail fast, and say which stage, when a function cannot be shipped to Ray workers."""
    from ray import cloudpickle

    for stage in stages:
        try:
            cloudpickle.dumps(stage.fn)
        except Exception as exc:
            raise TypeError(
                f"stage {stage.name!r}: its function cannot be pickled to send to Ray workers "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                "functions must not capture locks, open files, sockets or similar objects"
            ) from exc


def _check_satisfiable(stages: Sequence[Stage]) -> None:
    """Fail fast on a request no node can ever satisfy (Ray would wait forever)."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive", n.get("alive"))]
    if not nodes:
        return
    for stage in stages:
        wants = {"CPU": stage.num_cpus or 0, "GPU": stage.num_gpus or 0,
                 "memory": stage.memory_bytes or 0}
        if not any(all(res.get(k, 0) >= v for k, v in wants.items() if v) for res in nodes):
            best = {k: max(res.get(k, 0) for res in nodes) for k, v in wants.items() if v}
            raise UnsatisfiableResourcesError(
                f"stage {stage.name!r} asks for {_fmt(wants)} per task, but no node of the "
                f"cluster has that much (largest: {_fmt(best)}); the task could never run"
            )


def _fmt(resources: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in resources.items() if v) or "nothing"

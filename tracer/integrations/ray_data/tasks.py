"""What an execution tracer keeps per operator and per task, and how Ray Data's facts read.

Kept apart from :mod:`.execution` (which turns them into the run timeline's
facts) so that each stays small: the per-operator request from its ray remote
args, a task's counts and measurements while the trace needs it, the UDF's own
exception out of Ray Data's wrapper, and the wrapper that reports a hook's
fact after Ray Data's own hook ran.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from tracer.integrations.ray_data import _compat as compat
from tracer.ray import layout as L
from tracer.ray.resources import ResourceRequest
from tracer.ray.task_errors import CAUSE_LINE, error_args, exceptions_in_traceback
from tracer.ray.task_metrics import Metrics
from tracer.ray.timeline import TimelineTask

__all__ = ["DataTask", "Stage", "data_error_args", "finite", "hooked", "new_token"]


class DataTask(TimelineTask):
    """A Ray Data task while the trace needs it: in flight, or awaiting its measurements."""

    __slots__ = (
        "blocks_out",
        "bytes_out",
        "counts_in",
        "end_args",
        "ended",
        "expects_measurements",
        "key",
        "killed",
        "measurements",
        "ray_task_id",
        "rows_out",
        "uss_peak",
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.counts_in = (0, 0, 0)
        self.blocks_out = self.rows_out = self.bytes_out = 0
        self.ray_task_id: str | None = None
        self.uss_peak: int | None = None
        self.measurements: list[Metrics] = []
        self.ended = False
        self.end_args: dict[str, Any] = {}
        self.expects_measurements = False
        #: Ray killed it (its error said where: marked there, see ExecutionTracer.failure).
        self.killed = False
        self.key = (0, 0)  # (stage id, Ray Data's task index)


class Stage:
    """One physical operator of the execution."""

    __slots__ = (
        "backpressure_drawn",
        "backpressure_reasons",
        "backpressured_ns",
        "backpressured_since",
        "inflight",
        "measured",
        "name",
        "op",
        "queue_drawn",
        "queued_max",
        "request",
        "stage_id",
        "token",
    )

    def __init__(self, stage_id: int, op: Any, token: str | None) -> None:
        self.stage_id = stage_id
        self.op = op
        self.name = str(getattr(op, "name", type(op).__name__))
        self.token = token
        self.measured = token is not None  # its tasks send measurements
        args = compat.remote_args(op)
        self.request = ResourceRequest(
            num_cpus=float_or_none(args.get("num_cpus")),
            num_gpus=float_or_none(args.get("num_gpus")),
            memory_bytes=int_or_none(args.get("memory")),
        )
        self.inflight = 0
        # Its queued blocks and backpressure are drawn from their first sample that is not
        # 0 (a stage never queued nor held back has no such counters); the reasons seen.
        self.queue_drawn = False
        self.backpressure_drawn = False
        self.backpressure_reasons: set[tuple[str | None, str | None]] = set()
        self.queued_max = 0
        # Time held back in all, and since when it is now (None: not held back).
        self.backpressured_ns = 0
        self.backpressured_since: int | None = None


def data_error_args(error: BaseException) -> dict[str, str]:
    """``error_type`` and ``error`` of a Ray Data failure: the UDF's own exception.

    Ray Data wraps a UDF's exception in ``UserCodeException`` ("UDF failed to
    process a data block", then retry advice) whose text carries the
    original traceback first: its "Type: message" line is what went wrong.
    That is the first unindented line after the last frame before the (last)
    "direct cause" line: the exception the UDF raised (the worker records the
    same one), not one it was handling, nor a line of its message or source
    (a message may have any lines; source lines are indented). Any other
    error: :func:`~tracer.ray.task_errors.error_args`.
    """
    text = str(error)
    if CAUSE_LINE in text:
        raised = exceptions_in_traceback(text.rsplit(CAUSE_LINE, 1)[0])
        if raised:
            error_type, line = raised[-1]
            return {L.ARG_ERROR_TYPE: error_type, L.ARG_ERROR: line[:500]}
    return error_args(error)


def new_token() -> str:
    """An operator's token: how its tasks' measurements find their execution and stage."""
    return uuid.uuid4().hex[:16]


def hooked(
    original: Callable[..., Any],
    fact: Callable[[Stage, tuple[Any, ...], dict[str, Any]], None],
    stage: Stage,
    guard: Callable[..., None],
) -> Callable[..., Any]:
    """``original`` (Ray Data's hook), then the fact it reports, guarded."""

    def hook(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        guard(fact, stage, args, kwargs)
        return result

    hook.__tracer_hook__ = True  # type: ignore[attr-defined]
    return hook


def finite(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if f == f and f not in (float("inf"), float("-inf")) else None


def float_or_none(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None

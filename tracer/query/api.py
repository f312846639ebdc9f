"""The entry point of the query layer: :class:`TraceQuery` (its :class:`QueryConfig` is in
:mod:`tracer.query.config`, which loads without pandas)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from tracer.errors import InvalidArgumentTypeError, TraceReadError
from tracer.format import TraceModel, TraceScan, read_trace
from tracer.query import analyses
from tracer.query.collect import RAY_EVENTS_INFO, RUN_INFO, TraceRows, scan_rows
from tracer.query.columns import records, to_frame
from tracer.query.config import (
    ENGINES,
    Engine,
    QueryConfig,
    check_trace_file,
    framing_warning,
    newest_trace,
)
from tracer.query.errors import QueryError, TraceProcessorError, TraceProcessorNotFoundError
from tracer.query.oom import oom_reports
from tracer.query.processor import (
    ENV_VAR,
    find_trace_processor,
    one_line,
    start_trace_processor,
)
from tracer.query.sql import TABLES, sql_text, worker_utilisation_sql
from tracer.query.suggest import DEFAULT_HEADROOM, memory_suggestions
from tracer.ray import layout as L

__all__ = ["ENGINES", "Engine", "QueryConfig", "TraceQuery", "check_trace_file"]

def _wait_if_finishing(path: Path) -> None:
    """A run of this process whose trace is still being finished (Ray's last events come
    a second late, :mod:`tracer.ray.finishing`): wait for it. No such module loaded, no
    such run (and Ray's layer is not imported for it)."""
    finishing = sys.modules.get("tracer.ray.finishing")
    if finishing is not None:
        finishing.wait_for_traces(path)


class TraceQuery:
    """Answers from one runner trace: ready-made analyses as DataFrames, and any SQL.

    >>> with TraceQuery("run.perfetto-trace") as q:      # doctest: +SKIP
    ...     q.stage_summary()
    ...     q.query("SELECT COUNT(*) AS n FROM tracer_task")

    ``trace``: a trace file, or a folder of them (where a process's own runs
    write theirs: its newest is read, :attr:`path` says which), as every
    ``tracer`` command takes it. Opening checks the file:
    :class:`~tracer.errors.TraceReadError` if it is missing or not a Perfetto
    protobuf trace. The reader engine reads it
    when opened (streaming it, keeping a row per task). A truncated
    trace is analysed up to its last complete packet; :meth:`warnings` says
    so. trace_processor is started on first need and stopped by
    :meth:`close` (or the ``with`` block).

    In trace_processor, the tables of ``tracer_tables.sql`` (``tracer_task``,
    ``tracer_execution``, ``tracer_task_latency``) are defined before any
    query runs, so your SQL can use them.
    """

    def __init__(self, trace: str | os.PathLike[str], config: QueryConfig | None = None) -> None:
        self.path = Path(trace)
        if self.path.expanduser().is_dir():  # as every tracer command takes it
            self.path, _ = newest_trace(self.path)
        if config is not None and not isinstance(config, QueryConfig):
            raise InvalidArgumentTypeError(
                f"config must be a QueryConfig (e.g. QueryConfig(engine='reader')), "
                f"got {type(config).__name__} {config!r}"
            )
        self.config = config or QueryConfig()
        _wait_if_finishing(self.path)
        if not self.path.exists():
            raise TraceReadError(f"no such trace file: {self.path}")
        if not self.path.is_file():
            raise TraceReadError(f"not a file: {self.path}")
        self._tp: Any = None
        self._model: TraceModel | None = None
        self._rows: TraceRows | None = None
        self._scan: TraceScan | None = None
        self._fallback: str | None = None
        self._latency: analyses.Latency | None = None
        self._warnings: list[str] | None = None
        engine = self.config.engine
        if engine == "auto":
            try:
                self._bin: str | None = find_trace_processor(self.config.trace_processor_path)
                engine = "trace_processor"
            except TraceProcessorNotFoundError as exc:
                self._bin = None
                engine = "reader"
                if self.config.trace_processor_path or os.environ.get(ENV_VAR):
                    # A binary the user named but that cannot be used is a mistake to
                    # report; no binary anywhere is what auto is for, and stays quiet.
                    # (what is wrong with it, without the advice on getting one)
                    self._fallback = str(exc).split("; ", 1)[0]
        else:
            self._bin = None
        if engine == "trace_processor":
            try:
                self._processor()
            except TraceProcessorError as exc:
                if self.config.engine != "auto":
                    raise
                self._fallback = str(exc)  # auto: a binary that does not work is no binary
                engine = "reader"
        self.engine: Literal["reader", "trace_processor"] = engine
        if engine == "reader":
            self._rows, self._scan = scan_rows(self.path)

    # -------------------------------------------------------------- plumbing

    @property
    def model(self) -> TraceModel:
        """The trace as :func:`tracer.format.read_trace` reads it (read on first use).

        Every event of the trace, in memory (a few hundred bytes each): the
        analyses do not need it.
        """
        if self._model is None:
            self._model = read_trace(self.path)
        return self._model

    def _processor(self) -> Any:
        if self._tp is None:
            check_trace_file(self.path)
            if self._bin is None:
                self._bin = find_trace_processor(self.config.trace_processor_path)
            tp = start_trace_processor(
                self.path, self._bin, load_timeout=self.config.load_timeout,
                verbose=self.config.verbose,
            )
            try:
                tp.query(sql_text(TABLES))
            except Exception as exc:
                tp.close()
                # A cut gzip file, say, leaves trace_processor without even a slice table.
                damage = framing_warning(self.path)
                if damage is not None:
                    raise TraceProcessorError(
                        f"trace_processor could not read {self.path}: {damage}"
                    ) from exc
                raise TraceProcessorError(
                    f"trace_processor rejected tracer_tables.sql: {one_line(exc)}"
                ) from exc
            self._tp = tp
        return self._tp

    def query(self, sql: str) -> pd.DataFrame:
        """Run any SQL in trace_processor; the result of its last statement as a DataFrame.

        Raises :class:`~tracer.query.errors.QueryError` for SQL trace_processor
        rejects, and :class:`~tracer.query.errors.TraceProcessorNotFoundError`
        when no binary can be found.
        """
        tp = self._processor()
        try:
            result = tp.query(sql)
            frame = result.as_pandas_dataframe()
        except Exception as exc:
            raise QueryError(f"query failed: {one_line(exc)}") from exc
        return frame

    def _reader_rows(self) -> TraceRows:
        if self._rows is None:  # pragma: no cover - set when the reader engine opens
            self._rows, self._scan = scan_rows(self.path)
        return self._rows

    def _latency_rows(self) -> analyses.Latency:
        """The reader engine's tracer_task_latency, computed once."""
        if self._latency is None:
            self._latency = analyses.latency_rows(self._reader_rows())
        return self._latency

    def _analysis(
        self,
        name: str,
        compute: Callable[[], list[dict[str, Any]]],
        sql: str | None = None,
    ) -> pd.DataFrame:
        if self.engine == "trace_processor":
            try:
                frame = self.query(sql if sql is not None else sql_text(name))
            except QueryError as exc:
                raise QueryError(f"{name}.sql: {exc}") from exc
            return to_frame(frame, name)
        return to_frame(compute(), name)

    def run_info(self) -> dict[str, Any]:
        """The traced run: ``execution_id``, ``runner``, ``tracing_level``, and what the
        trace says of Ray's events: ``ray_events_source`` (where they were read:
        ``gcs``, ``dashboard``, ``all`` or ``none``), ``ray_events_missing``
        (executions without them), ``ray_events_dropped`` (events Ray says it
        dropped); and the driver's Python GC while the run was traced:
        ``driver_gc_collections``, ``driver_gc_ns`` (their time in all),
        ``driver_gc_longest_ns``; ``error_type`` and ``error`` when the run ended
        with an error (the traced block raised, the driver exited with the tracer
        open: ``DriverExitedError``); ``memory_request_mismatches``, the executions
        Ray reserved another memory for than their ``ResourceRequest`` said (their
        ``memory_requested`` is Ray's); ``memray_per_task``, the executions level 2
        measured with a memray tracker each (the slower way), and
        ``memray_per_task_reason``, why; ``lost_measurements``, the tasks whose
        measurements never came, and ``measurements_stopped``, why the channel that
        carried them stopped during the run (Ray Data's metrics actor failed). Each
        None when the trace does not say.

        Read from the dispatch loop's ``execution`` slice and its ``Ray's
        events read`` instant (the first ones, if the trace holds several).
        """
        if self.engine == "trace_processor":
            info: dict[str, Any] = {}
            for keys, where in (
                (RUN_INFO, "name = 'execution' AND depth = 0"),
                (RAY_EVENTS_INFO, "name = '{}'".format(L.INSTANT_RAY_EVENTS.replace("'", "''"))),
            ):
                columns = ", ".join(
                    f"EXTRACT_ARG(arg_set_id, 'debug.{k}') AS {k}" for k in keys
                )
                rows = records(self.query(
                    f"SELECT {columns} FROM slice WHERE category = 'scheduler' AND {where} "
                    "ORDER BY ts, id LIMIT 1"
                ))
                if rows:
                    info.update(rows[0])
        else:
            rows_ = self._reader_rows()
            info = {**rows_.run_info, **rows_.ray_events_info}
        return {k: info.get(k) for k in (*RUN_INFO, *RAY_EVENTS_INFO)}

    def warnings(self) -> list[str]:
        """What may make the answers incomplete: truncation, unterminated slices, problems.

        Worked out once (the trace does not change); a new list each call.
        """
        if self._warnings is None:
            self._warnings = self._find_warnings()
        return list(self._warnings)

    def _find_warnings(self) -> list[str]:
        out: list[str] = []
        if self._fallback is not None:
            out.append(f"{self._fallback.rstrip('.')}; used tracer's reader instead")
        if self.engine == "trace_processor":
            # trace_processor reads a cut trace without a word (one cut inside its
            # compressed bundle reads as an empty trace): the framing says it.
            framing = framing_warning(self.path)
            if framing is not None:
                out.append(framing)
            open_slices = self.query("SELECT COUNT(*) AS n FROM slice WHERE dur < 0")["n"].iloc[0]
            if open_slices:
                out.append(
                    f"{open_slices} slice(s) never ended: the trace was probably cut while "
                    "being written; the answers cover what is there"
                )
            return out
        model = self._scan
        assert model is not None
        if model.truncated and model.packet_count == 0:
            out.append(
                "the trace is cut before its first complete packet: there is nothing to "
                "analyse (a compressed trace loses the bundle it was writing when a run dies)"
            )
        elif model.truncated:
            out.append(
                f"the trace is truncated (cut while being written?): analysing the "
                f"{model.packet_count} complete packets before the cut"
            )
        counts = {k: v for k, v in model.problem_counts.items() if v}
        if counts:
            listed = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in sorted(counts.items()))
            out.append(f"problems in the trace: {listed}")
        return out

    def close(self) -> None:
        """Stop trace_processor, if it was started."""
        if self._tp is not None:
            tp, self._tp = self._tp, None
            tp.close()

    def __enter__(self) -> TraceQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -------------------------------------------------------------- analyses

    def stage_summary(self) -> pd.DataFrame:
        """Per stage: tasks, failed, wall span, task running time p50/p95/max, memory."""
        return self._analysis(
            "stage_summary", lambda: analyses.stage_summary(self._latency_rows())
        )

    def task_latency(self) -> pd.DataFrame:
        """Per task attempt: waiting, scheduling, running, pickup and total (ns)."""
        return self._analysis(
            "task_latency", lambda: analyses.task_latency(self._latency_rows())
        )

    def latency_by_stage(self) -> pd.DataFrame:
        """Per stage: p50 and p95 of each latency phase (ns)."""
        return self._analysis(
            "latency_by_stage", lambda: analyses.latency_by_stage(self._latency_rows())
        )

    def dispatch_loop(self) -> pd.DataFrame:
        """The dispatch loop's time per phase, and the gaps between phases."""
        return self._analysis(
            "dispatch_loop", lambda: analyses.dispatch_loop(self._reader_rows())
        )

    def worker_utilisation(self, buckets: int = 20) -> pd.DataFrame:
        """Busy fraction of every worker of every node in ``buckets`` equal time buckets: in
        its executions, and with Ray's handling of each around it (``busy_with_ray_*``)."""
        sql = worker_utilisation_sql(buckets)
        return self._analysis(
            "worker_utilisation",
            lambda: analyses.worker_utilisation(self._reader_rows(), buckets),
            sql,
        )

    def actor_starts(self) -> pd.DataFrame:
        """Per stage whose engine started actors for it (Ray Data's actor pools): actors
        created, those seen ready, and how long they took to start (p50, max; ns)."""
        return self._analysis("actor_starts", lambda: analyses.actor_starts(self._reader_rows()))

    def stage_queues(self) -> pd.DataFrame:
        """Per stage whose engine queues its input and holds it back (Ray Data): the most
        blocks queued at its input at once, and its time held back (ns)."""
        return self._analysis("stage_queues", lambda: analyses.stage_queues(self._reader_rows()))

    def task_failures(self) -> pd.DataFrame:
        """The task attempts that failed or were cancelled, in the order they were created:
        their stage, ``status`` and the error (``error_type``, ``error``) as recorded."""
        return self._analysis("task_failures", lambda: analyses.task_failures(self._reader_rows()))

    def task_retries(self) -> pd.DataFrame:
        """The tasks Ray ran more than once (an OOM-killed or crashed worker, a lost node,
        ``retry_exceptions``), whatever became of them: ``ray_attempts``, the attempts seen
        to fail (``failed_attempts_seen``, from Ray's events: the first one's
        ``error_type``, the largest ``memory_at_kill``) and the ``node`` it ran on last.
        An OOM kill that Ray retried counts in the memory tables too."""
        return self._analysis("task_retries", lambda: analyses.task_retries(self._reader_rows()))

    def memory_by_stage(self) -> pd.DataFrame:
        """Per stage: requested vs measured peak memory, tasks over their request."""
        return self._analysis(
            "memory_by_stage", lambda: analyses.memory_by_stage(self._latency_rows())
        )

    def memory_by_node(self) -> pd.DataFrame:
        """Per node: measured peak memory, tasks over their request."""
        return self._analysis(
            "memory_by_node", lambda: analyses.memory_by_node(self._latency_rows())
        )

    def memory_flagged(self) -> pd.DataFrame:
        """The task attempts whose measured peak exceeded their memory request, worst first."""
        return self._analysis(
            "memory_flagged", lambda: analyses.memory_flagged(
                self._latency_rows(), analyses.retried_kill_places(self._reader_rows()))
        )

    def oom_reports(self) -> pd.DataFrame:
        """The processes Ray's OOM killer reported as its node's largest at each kill: the
        task that took the memory, even where Ray killed another; see :mod:`tracer.query.oom`."""
        return oom_reports(self)

    def memory_suggestions(
        self, headroom: float = DEFAULT_HEADROOM, node_memory: int | str | None = None
    ) -> pd.DataFrame:
        """Per stage: the ``memory=`` to request (its largest peak x ``headroom``, rounded up
        to a MiB), how many such tasks fit a node, and the change from today's request.

        ``node_memory`` (bytes, or a size such as ``"64 GiB"``) is a node's
        ``memory`` resource; by default the
        cluster's, from the trace, over the nodes that ran tasks. The rule and
        its limits: :mod:`tracer.query.suggest`.
        """
        return memory_suggestions(self, headroom, node_memory)

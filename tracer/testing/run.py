"""A block of test code run at tracing level 2, and the measured tasks it leaves.

:class:`TracedMemory` is the ``traced_memory`` fixture's value: ``with
traced_memory as run:`` sets ``TRACER_ENABLE_RAY_TRACING=2`` and
``TRACER_TRACE_DIR`` (a folder of the block's own) for the block, so every
run through tracer's API that takes its level and path from the environment
(``ray_tracer(...)``, ``Pipeline.run()``, Daft's traced runner) writes its
trace there, memray measuring every task. At the end of the block the traces
are read through :class:`tracer.query.TraceQuery`'s public analyses into
:class:`TaskMemory` rows on the :class:`TracedRun`, which holds the
assertions (:mod:`tracer.testing.checks`).

Why environment variables: the code under test is the user's, unchanged,
and may run its pipeline in a subprocess (which inherits them). What they do
not change: an explicit ``level=``/``tracing_level=`` or ``path=``/
``trace_path=`` in that code wins; the block then finds no trace, or one at
the wrong level, and fails saying so rather than passing.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import TracebackType
from typing import Any

from tracer.errors import add_note
from tracer.testing.errors import TracedMemoryError

__all__ = ["LEVEL_ENV_VAR", "TRACE_DIR_ENV_VAR", "TaskMemory", "TracedMemory", "TracedRun"]

#: tracer.ray.levels.ENV_VAR and tracer.ray.output.TRACE_DIR_ENV_VAR (the same
#: names, spelled out: importing tracer.ray costs every test session ~0.2 s).
LEVEL_ENV_VAR = "TRACER_ENABLE_RAY_TRACING"
TRACE_DIR_ENV_VAR = "TRACER_TRACE_DIR"
_TRACE_SUFFIX = ".perfetto-trace"

_active: list[TracedMemory] = []


@dataclasses.dataclass(frozen=True)
class TaskMemory:
    """One task attempt of a traced block, with its memory.

    ``requested`` is its Ray ``memory=`` request (None: it asked for none); ``peak`` the
    measured peak (memray's heap peak at level 2; None: not measured, e.g.
    measurements lost, or killed); ``oom_killed`` with ``killed_at``, the
    worker's memory Ray reported at its largest kill (an attempt Ray ran again
    counts; where its measured peak is more, that). ``peak_source`` is ``"heap"``,
    ``"uss"`` (the engine's own figure: Ray Data) or ``"rss"`` when known
    (tasks over their request), else None.
    """

    stage: str
    stage_id: Any
    task_id: str
    attempt: int
    status: str
    node: str | None
    worker: str | None
    requested: int | None
    peak: int | None
    peak_source: str | None
    oom_killed: bool
    killed_at: int | None
    trace: Path

    @property
    def used(self) -> int | None:
        """The memory to judge it by: its peak, or for a killed task its memory at the kill
        where that is more (an attempt Ray ran again may have been killed using more than
        the attempt that was measured)."""
        if self.peak is not None and (self.killed_at is None or self.peak >= self.killed_at):
            return self.peak
        return self.killed_at

    @property
    def measured(self) -> bool:
        return self.used is not None

    @property
    def ratio(self) -> float | None:
        """peak / request (None without either)."""
        used = self.used
        if used is None or not self.requested:
            return None
        return used / self.requested


class TracedRun:
    """What one ``with traced_memory as run:`` block ran: its traces and measured tasks.

    Filled when the block ends; until then its properties raise. The
    assertions are methods: :meth:`assert_within_request`,
    :meth:`assert_stage_peak`, :meth:`assert_no_oom_kill`.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._traces: list[Path] | None = None
        self._tasks: list[TaskMemory] = []
        self._warnings: list[str] = []

    # -------------------------------------------------------------- loading

    def _load(self) -> None:
        """Read the block's traces; raise :class:`TracedMemoryError` when there is nothing
        to check (which a budget test must never take for a pass)."""
        __tracebackhide__ = True
        from tracer.query import QueryConfig, TraceQuery, records

        traces = sorted(self.folder.glob(f"*{_TRACE_SUFFIX}"))
        if not traces:
            raise TracedMemoryError(
                f"the block wrote no trace to {self.folder}: no run went through tracer's API "
                "with its level and path from the environment. Code that passes level=0 / "
                "tracing_level=0, or its own path= / trace_path=, is not redirected (the "
                "explicit argument wins); drop the argument inside a memory-budget test"
            )
        tasks: list[TaskMemory] = []
        for path in traces:
            with TraceQuery(path, QueryConfig(engine="reader")) as q:
                level = q.run_info().get("tracing_level")
                if level != 2:
                    raise TracedMemoryError(
                        f"{path} was written at tracing level {level}, not 2: an explicit "
                        "level= / tracing_level= in the code wins over the block's "
                        f"{LEVEL_ENV_VAR}=2; drop it (or pass 2) so that memray measures "
                        "each task's heap"
                    )
                self._warnings.extend(f"{path.name}: {w}" for w in q.warnings())
                flagged = {
                    (r["task_id"], r["attempt"]): r for r in records(q.memory_flagged())
                }
                for row in records(q.task_latency()):
                    tasks.append(_task(row, flagged.get((row["task_id"], row["attempt"])), path))
        if not tasks:
            raise TracedMemoryError(
                f"the block's traces hold no task ({', '.join(str(t) for t in traces)}): "
                "the runner was traced but dispatched nothing"
            )
        if not any(t.measured for t in tasks):
            raise TracedMemoryError(
                f"none of the block's {len(tasks)} task(s) was measured (their measurements "
                f"were lost?): nothing to check; traces: {', '.join(str(t) for t in traces)}"
            )
        self._tasks = tasks
        self._traces = traces

    def _ended(self) -> list[TaskMemory]:
        __tracebackhide__ = True
        if self._traces is None:
            raise TracedMemoryError(
                "the traced block has not ended (or ended with an exception): its tasks are "
                "known after the `with traced_memory as run:` block"
            )
        return self._tasks

    # -------------------------------------------------------------- what it ran

    @property
    def traces(self) -> list[Path]:
        """The traces the block wrote (one per traced execution), kept after the test."""
        self._ended()
        assert self._traces is not None
        return list(self._traces)

    @property
    def tasks(self) -> list[TaskMemory]:
        """Every task attempt of every trace, in creation order per trace."""
        return list(self._ended())

    @property
    def stages(self) -> dict[str, list[TaskMemory]]:
        """The tasks by stage name, stages in the order their first task appears."""
        out: dict[str, list[TaskMemory]] = {}
        for task in self._ended():
            out.setdefault(task.stage, []).append(task)
        return out

    @property
    def warnings(self) -> list[str]:
        """What may make the traces incomplete (a truncated trace...), from TraceQuery."""
        self._ended()
        return list(self._warnings)

    def stage_tasks(self, stage: str) -> list[TaskMemory]:
        """The tasks of ``stage``; a :class:`TracedMemoryError` listing the stages there
        are when there is none of that name."""
        __tracebackhide__ = True
        stages = self.stages
        if not isinstance(stage, str) or stage not in stages:
            known = ", ".join(repr(s) for s in stages) or "none"
            raise TracedMemoryError(f"no stage named {stage!r} ran in the block; stages: {known}")
        return stages[stage]

    def stage_peak(self, stage: str, stat: str = "max") -> int:
        """The stage's ``"max"`` or ``"p<N>"`` (nearest-rank, e.g. ``"p95"``) peak, in bytes."""
        from tracer.testing.checks import parse_stat, stage_values, stat_of

        percentile = parse_stat(stat)
        values = stage_values(self, stage)
        return stat_of(values, percentile)

    def summary(self) -> str:
        """Per stage: tasks, measured, largest request, p50 and max peak (for a print)."""
        from tracer.testing.checks import stage_summary

        return stage_summary(self)

    def __repr__(self) -> str:
        if self._traces is None:
            return f"<TracedRun {self.folder} (running)>"
        return f"<TracedRun {len(self._tasks)} tasks in {len(self._traces)} trace(s)>"

    # -------------------------------------------------------------- assertions

    def assert_within_request(self, factor: float = 1.0, *, stages: Any = None) -> None:
        """Every measured task's peak is at most ``factor`` x its memory request (Ray's
        ``memory=``; ``Stage(memory_bytes=)`` in tracer's runner), and no task was
        OOM-killed. ``stages``: a name or names to check (default: all).

        Tasks that requested no memory are not compared (there is nothing to
        compare with); when no checked task requested any, this raises
        :class:`TracedMemoryError` instead of passing.
        """
        __tracebackhide__ = True
        from tracer.testing.checks import check_within_request

        check_within_request(self, factor, stages)

    def assert_stage_peak(self, stage: str, budget: str | int, *, stat: str = "max") -> None:
        """The stage's ``stat`` (``"max"``, or ``"p95"``-style nearest-rank percentile) of
        task peaks is at most ``budget`` (``"512 MiB"``, or bytes); a task of the stage
        killed for memory fails it whatever its numbers."""
        __tracebackhide__ = True
        from tracer.testing.checks import check_stage_peak

        check_stage_peak(self, stage, budget, stat)

    def assert_no_oom_kill(self) -> None:
        """No task of the block was killed by Ray's OOM killer."""
        __tracebackhide__ = True
        from tracer.testing.checks import check_no_oom_kill

        check_no_oom_kill(self)


def _task(row: dict[str, Any], flagged: dict[str, Any] | None, trace: Path) -> TaskMemory:
    """A task_latency row, with what memory_flagged adds for tasks over their request or
    killed (the source of the peak, the memory at the kill)."""
    killed = flagged is not None and flagged["reason"] == "oom killed"
    # The measured peak's own source (the flagged row's is 'at kill' where a kill used more:
    # an attempt Ray ran again), and for a killed task the flagged row's figure (its
    # largest kill, or its measured peak where that is more).
    peak_source = row["peak_source"] if flagged is not None and row["memory_peak"] is not None \
        else None
    killed_at = int(flagged["peak_bytes"]) if killed and flagged is not None \
        and flagged["peak_bytes"] is not None else None
    return TaskMemory(
        stage=str(row["stage"]),
        stage_id=row["stage_id"],
        task_id=str(row["task_id"]),
        attempt=int(row["attempt"] or 0),
        status=str(row["status"]),
        node=row["node"],
        worker=row["worker"],
        requested=int(row["memory_requested"]) if row["memory_requested"] else None,
        peak=None if row["memory_peak"] is None else int(row["memory_peak"]),
        peak_source=peak_source,
        oom_killed=killed,
        killed_at=killed_at,
        trace=trace,
    )


class TracedMemory:
    """The ``traced_memory`` fixture: ``with traced_memory as run:`` traces the block at
    level 2 into a folder of its own and yields its :class:`TracedRun`.

    Usable several times in one test (each block is a run of its own, in a
    subfolder); blocks do not nest. The environment is restored at the end
    of the block, even when it raises.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.runs: list[TracedRun] = []
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> TracedRun:
        __tracebackhide__ = True
        if _active:
            raise TracedMemoryError(
                "traced memory blocks do not nest (a block is already running: a "
                "memory-budget marker and the traced_memory fixture in one test, or a "
                "`with traced_memory` inside another)"
            )
        folder = self.folder / f"block-{len(self.runs)}"
        folder.mkdir(parents=True, exist_ok=False)
        run = TracedRun(folder)
        self._saved = {name: os.environ.get(name) for name in (LEVEL_ENV_VAR, TRACE_DIR_ENV_VAR)}
        os.environ[LEVEL_ENV_VAR] = "2"
        os.environ[TRACE_DIR_ENV_VAR] = str(folder)
        self.runs.append(run)
        _active.append(self)
        return run

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        __tracebackhide__ = True
        _active.remove(self)
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        run = self.runs[-1]
        if exc is None:
            run._load()
        elif isinstance(exc, Exception) and any(run.folder.glob(f"*{_TRACE_SUFFIX}")):
            add_note(exc, f"traced memory: the block's traces are in {run.folder}")



"""Memory budgets as tests: a pytest plugin (registered as ``tracer`` through ``pytest11``).

The fixture runs the code inside a block at tracing level 2 (every task under
memray) into a folder of its own, and checks what the tasks used::

    def test_inflate_fits(traced_memory):
        with traced_memory as run:
            Pipeline(parts, stages).run()          # any runner on tracer's API
        run.assert_within_request()                # every peak <= its memory request (or factor=)
        run.assert_stage_peak("inflate", "512 MiB", stat="p95")
        run.assert_no_oom_kill()
        run.stages["inflate"]                      # the measured tasks (TaskMemory)

and the markers do the same around a whole test::

    @pytest.mark.memory_within_request             # or (factor=1.5)
    @pytest.mark.stage_memory_limit("inflate", "256 MiB")          # stat="max" or "p95"
    def test_pipeline():
        Pipeline(parts, stages).run()

Loading this module imports nothing but the standard library and pytest
(pytest loads every ``pytest11`` plugin into every session of every project
with tracer installed); the query layer (pandas) is imported by the fixture
and the markers when a test uses them. How the block finds its traces, and
what an explicit ``level=``/``path=`` in the code does to it: see
:mod:`tracer.testing.run`. The assertions and their messages:
:mod:`tracer.testing.checks`.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tracer.testing.errors import MemoryBudgetError, TracedMemoryError

if TYPE_CHECKING:
    from tracer.testing.run import TaskMemory, TracedMemory, TracedRun

__all__ = [
    "MARKERS",
    "MemoryBudgetError",
    "TaskMemory",
    "TracedMemory",
    "TracedMemoryError",
    "TracedRun",
    "traced_memory",
]

WITHIN_REQUEST = "memory_within_request"
STAGE_LIMIT = "stage_memory_limit"

#: The markers, as ``pytest --markers`` lists them.
MARKERS = {
    WITHIN_REQUEST: (
        "memory_within_request(factor=1.0): run the test at tracing level 2 and fail it when "
        "a task's memory peak exceeds factor x its memory request, or a task is OOM-killed "
        "(tracer.testing)"
    ),
    STAGE_LIMIT: (
        "stage_memory_limit(stage, budget, stat='max'): run the test at tracing level 2 and "
        "fail it when the stage's max (or 'p95'...) task peak exceeds budget, e.g. '256 MiB' "
        "(tracer.testing)"
    ),
}

_LAZY = {"TaskMemory", "TracedMemory", "TracedRun"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from tracer.testing import run

        return getattr(run, name)
    raise AttributeError(f"module 'tracer.testing' has no attribute {name!r}")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)


@pytest.fixture
def traced_memory(tmp_path_factory: pytest.TempPathFactory) -> TracedMemory:
    """``with traced_memory as run:`` runs the block at tracing level 2 into a folder of
    pytest's temporary ones (kept as pytest keeps them); ``run`` has the measured tasks
    and the assertions (:class:`tracer.testing.run.TracedRun`)."""
    from tracer.testing.run import TracedMemory

    return TracedMemory(tmp_path_factory.mktemp("traced-memory"))


def _checks(item: pytest.Item) -> list[Any]:
    """The item's budget markers as checks of a TracedRun, validated before the test runs."""
    __tracebackhide__ = True
    from tracer.sizes import parse_size
    from tracer.testing import checks as C

    out: list[Any] = []
    for mark in item.iter_markers():
        if mark.name == WITHIN_REQUEST:
            args, kwargs = list(mark.args), dict(mark.kwargs)
            factor = kwargs.pop("factor", args.pop(0) if args else 1.0)
            stages = kwargs.pop("stages", None)
            if args or kwargs:
                raise TracedMemoryError(
                    f"@pytest.mark.{WITHIN_REQUEST} takes factor= and stages=, "
                    f"got extra {args or ''}{kwargs or ''}"
                )
            C.parse_factor(factor)
            out.append(functools.partial(C.check_within_request, factor=factor, stages=stages))
        elif mark.name == STAGE_LIMIT:
            args, kwargs = list(mark.args), dict(mark.kwargs)
            names = ("stage", "budget", "stat")
            values = dict(zip(names, args, strict=False))
            for key in list(kwargs):
                if key in names and key not in values:
                    values[key] = kwargs.pop(key)
            if len(args) > len(names) or kwargs or "stage" not in values or "budget" not in values:
                raise TracedMemoryError(
                    f"@pytest.mark.{STAGE_LIMIT} takes (stage, budget, stat='max'), e.g. "
                    f"{STAGE_LIMIT}('inflate', '256 MiB'); got args {tuple(mark.args)} "
                    f"kwargs {dict(mark.kwargs)}"
                )
            stage, budget = values["stage"], values["budget"]
            stat = values.get("stat", "max")
            if not isinstance(stage, str):
                raise TracedMemoryError(f"{STAGE_LIMIT}: stage must be a name, got {stage!r}")
            parse_size(budget, f"{STAGE_LIMIT} budget for stage {stage!r}")
            C.parse_stat(stat)
            out.append(functools.partial(C.check_stage_peak, stage=stage, budget=budget, stat=stat))
    return out


def _new_style_wrappers() -> bool:
    """Whether pluggy takes ``wrapper=True`` hooks (pluggy 1.2, pytest 8); without them
    the markers cannot wrap a test, and say so rather than let it pass unchecked."""
    try:
        pytest.hookimpl(wrapper=True)
    except TypeError:
        return False
    return True


def _marked(item: pytest.Item) -> bool:
    return item.get_closest_marker(WITHIN_REQUEST) is not None or (
        item.get_closest_marker(STAGE_LIMIT) is not None
    )


if _new_style_wrappers():

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
        """A test with a budget marker runs inside a traced block; the checks follow it."""
        __tracebackhide__ = True
        if not _marked(item):
            return (yield)
        from tracer.testing.run import TracedMemory

        checks = _checks(item)  # bad marker arguments fail the test before it runs
        folder = Path(tempfile.mkdtemp(prefix="tracer-memory-"))
        try:
            with TracedMemory(folder) as run:
                result = yield
            for check in checks:
                check(run)
        except BaseException:
            # A failure keeps the traces, named in its message (an empty folder goes).
            if not any(folder.rglob("*.perfetto-trace")):
                shutil.rmtree(folder, ignore_errors=True)
            raise
        shutil.rmtree(folder, ignore_errors=True)  # passed: nothing to look at
        return result

else:  # pragma: no cover - pytest < 8

    def pytest_runtest_setup(item: pytest.Item) -> None:
        if _marked(item):
            raise TracedMemoryError(
                f"@pytest.mark.{WITHIN_REQUEST} and @pytest.mark.{STAGE_LIMIT} need pytest >= 8 "
                f"(pluggy >= 1.2), this is pytest {pytest.__version__}; the traced_memory "
                "fixture works with it"
            )

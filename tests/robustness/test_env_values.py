"""Bad values in tracer's environment variables: one warning, a sensible default, never a failure.

A variable is set far from the code that reads it (a job's environment, a
cluster's runtime_env, inherited by every worker), so a value tracer cannot
read must not fail the job nor quietly mean something else. Real Ray where a
run is involved; the readers' rule itself (tracer._env) needs no Ray.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import ray
from trace_checks import load_complete

from tracer.format import _tokenizer
from tracer.format import writer as writer_module
from tracer.ray import collect_ray_task_metrics, default_trace_dir, memory_session, ray_tracer
from tracer.ray import layout as L
from tracer.ray.events_channel import (
    DEFAULT_BUDGET_S,
    ENV_BUDGET,
    ENV_SWITCH,
    close_budget_s,
    enabled_by_env,
)
from tracer.ray.finishing import ENV_WAIT, close_waits
from tracer.ray.output import TRACE_DIR_ENV_VAR, ray_session_dir
from tracer.runner import Pipeline, Stage


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records
        if r.name == "tracer" and r.levelno == logging.WARNING
    ]


def _double(x: int) -> int:
    return x * 2


# ---------------------------------------------------------------- TRACER_TRACE_DIR


@pytest.mark.usefixtures("ray_local")
def test_a_trace_dir_whose_home_cannot_be_found_falls_back_to_the_session_folder(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``~nosuchuser/traces``: expanding it raised outside every guard and killed the run.
    Now the run is traced to the Ray session's folder, and one warning says so."""
    caplog.set_level(logging.WARNING, logger="tracer")
    value = f"~nosuchuser{uuid.uuid4().hex[:8]}/traces"
    monkeypatch.setenv(TRACE_DIR_ENV_VAR, value)
    fallback = ray_session_dir() / "logs" / "tracer"
    assert default_trace_dir() == fallback  # every default path comes from here: no raise
    pipeline = Pipeline(list(range(6)), [Stage("double", _double)])
    assert pipeline.run(tracing_level=1, progress=False) == [x * 2 for x in range(6)]
    assert pipeline.trace_path is not None and Path(pipeline.trace_path).parent == fallback
    load_complete(pipeline.trace_path)
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert TRACE_DIR_ENV_VAR in warnings[0] and value in warnings[0]
    assert str(fallback) in warnings[0]


# ------------------------------------------------- TRACER_ENABLE_RAY_TRACING in workers


@pytest.mark.usefixtures("ray_local")
def test_a_bad_level_in_the_workers_environment_never_fails_their_tasks(tmp_path: Path) -> None:
    """Daft-style tasks measuring themselves, in workers whose environment says ``loud``
    (``on`` was the case found; it now means level 1): every task raised
    InvalidTracingLevelError. Now they run, unmeasured (level off)."""

    # Defined here, so that Ray sends it by value to the workers of this runtime env.
    def self_measuring(execution_id: str, task_id: str, x: int) -> tuple[int, bool]:
        with collect_ray_task_metrics(execution_id, task_id, 0) as metrics:
            return x * 2, metrics is None

    env = {"env_vars": {"TRACER_ENABLE_RAY_TRACING": "loud"}}
    task = ray.remote(runtime_env=env)(self_measuring)
    # The driver traces at level 0 (the worker side must not care), then at level 1.
    for level in (0, 1):
        path = tmp_path / f"level{level}.perfetto-trace"
        with ray_tracer(f"badenv{level}", level=level, metrics_actor=True, path=path):
            results = ray.get([task.remote(f"badenv{level}", f"t{i}", i) for i in range(4)])
        assert results == [(i * 2, True) for i in range(4)]


# ------------------------------------------------------------ durations in seconds


@pytest.mark.parametrize("value", ["nan", "-1", "-inf", "1e999", "soon"])
def test_a_budget_that_is_not_a_finite_duration_warns_and_is_the_default(
    value: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    monkeypatch.setenv(ENV_BUDGET, value)
    assert close_budget_s() == DEFAULT_BUDGET_S
    assert close_budget_s() == DEFAULT_BUDGET_S
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and ENV_BUDGET in warnings[0] and repr(value) in warnings[0]


@pytest.mark.usefixtures("ray_local")
def test_an_infinite_budget_still_draws_rays_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``inf`` overflowed the close's lock timeout (logged at DEBUG) and every execution
    lost Ray's events; now it is the default budget, with a warning."""
    caplog.set_level(logging.WARNING, logger="tracer")
    monkeypatch.setenv(ENV_BUDGET, "inf")
    path = tmp_path / "inf.perfetto-trace"
    Pipeline(list(range(4)), [Stage("double", _double)]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    model = load_complete(path)
    (read,) = [i for i in model.instants if i.name == L.INSTANT_RAY_EVENTS]
    assert read.args[L.ARG_RAY_EVENTS_MISSING] == 0, read.args
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and ENV_BUDGET in warnings[0], warnings


# ------------------------------------------------------------------------ switches


def _memray_per_task() -> bool:
    """Is a tracker forced around every task by the variable (not for another reason)?"""
    return memory_session.PER_TASK_ENV in (memory_session.disabled_reason() or "")


#: Every boolean TRACER_* switch: (variable, what reads it as True when on, its default,
#: whether reading it here means anything).
SWITCHES: list[tuple[str, Callable[[], bool], bool, bool]] = [
    (ENV_SWITCH, enabled_by_env, True, True),
    (ENV_WAIT, close_waits, False, True),
    (memory_session.PER_TASK_ENV, _memray_per_task, False, True),
    (writer_module.PURE_PYTHON_ENV, lambda: not writer_module.use_speedups(), False,
     writer_module._speedups is not None),
    (writer_module.PURE_PYTHON_ENV, lambda: not _tokenizer.use_read_speedups(), False,
     _tokenizer._readspeedups is not None),
]
_IDS = ["ray_events", "ray_events_wait", "memray_per_task", "pure_python_writer",
        "pure_python_reader"]


@pytest.mark.parametrize("switch", SWITCHES, ids=_IDS)
@pytest.mark.parametrize(
    ("value", "on"),
    [("1", True), ("true", True), ("YES", True), (" on ", True),
     ("0", False), ("false", False), ("No", False), ("off", False)],
)
def test_every_switch_reads_the_same_words_the_same_way(
    switch: tuple[str, Callable[[], bool], bool, bool], value: str, on: bool,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """``TRACER_MEMRAY_PER_TASK=false`` turned per-task memray on, ``TRACER_PURE_PYTHON=false``
    the C writer off, while ``TRACER_RAY_EVENTS`` read the same words as off."""
    caplog.set_level(logging.WARNING, logger="tracer")
    var, read, _, means_something = switch
    if not means_something:
        pytest.skip("the C extension is not built here: TRACER_PURE_PYTHON changes nothing")
    monkeypatch.setenv(var, value)
    assert read() is on
    assert _warnings(caplog) == []


@pytest.mark.parametrize("switch", SWITCHES, ids=_IDS)
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_switch_is_an_unset_one(
    switch: tuple[str, Callable[[], bool], bool, bool], value: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """``VAR=`` (a shell's or a CI template's way of leaving it out) is the default, quietly."""
    caplog.set_level(logging.WARNING, logger="tracer")
    var, read, default, means_something = switch
    if not means_something:
        pytest.skip("the C extension is not built here: TRACER_PURE_PYTHON changes nothing")
    monkeypatch.setenv(var, value)
    assert read() is default
    assert _warnings(caplog) == []


@pytest.mark.parametrize("switch", SWITCHES, ids=_IDS)
def test_a_switch_value_that_is_no_word_warns_once_and_is_the_default(
    switch: tuple[str, Callable[[], bool], bool, bool], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    var, read, default, means_something = switch
    if not means_something:
        pytest.skip("the C extension is not built here: TRACER_PURE_PYTHON changes nothing")
    monkeypatch.delenv(var, raising=False)
    assert read() is default
    value = f"maybe-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv(var, value)
    assert read() is default
    assert read() is default
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and var in warnings[0] and repr(value) in warnings[0], warnings

"""Bad input everywhere gets a clear error at once: never a hang, never a corrupt file."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from tracer.errors import InvalidTracingLevelError, TraceReadError
from tracer.format import read_trace
from tracer.runner import Pipeline, Stage, UnsatisfiableResourcesError


@pytest.mark.usefixtures("ray_local")
def test_unpicklable_stage_function_names_the_stage(tmp_path: Path) -> None:
    local_lock = threading.Lock()

    def f(x: int) -> int:
        with local_lock:
            return x

    with pytest.raises(TypeError, match=r"stage 'locky'.*cannot be pickled"):
        Pipeline([1, 2], [Stage("locky", f)]).run(
            tracing_level=1, trace_path=tmp_path / "t.perfetto-trace"
        )


@pytest.mark.usefixtures("ray_local")
def test_unsatisfiable_request_fails_fast_instead_of_hanging(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(UnsatisfiableResourcesError, match=r"stage 'huge'.*CPU=64"):
        Pipeline([1], [Stage("huge", abs, num_cpus=64)]).run(
            tracing_level=1, trace_path=tmp_path / "t.perfetto-trace"
        )
    assert time.monotonic() - start < 10
    with pytest.raises(UnsatisfiableResourcesError, match="memory"):
        Pipeline([1], [Stage("greedy", abs, memory_bytes=1 << 50)]).run(tracing_level=0)


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("level", [3, -1, "verbose", "1.5", True])
def test_invalid_tracing_level_names_the_valid_ones(level: object) -> None:
    with pytest.raises(InvalidTracingLevelError, match=r"0 \(off\), 1 \(timeline\), 2 \(memory\)"):
        Pipeline([1], [Stage("s", abs)]).run(tracing_level=level)  # type: ignore[arg-type]


@pytest.mark.usefixtures("ray_local")
def test_invalid_tracing_level_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACER_ENABLE_RAY_TRACING", "yes please")
    with pytest.raises(InvalidTracingLevelError, match="TRACER_ENABLE_RAY_TRACING"):
        Pipeline([1], [Stage("s", abs)]).run()


def test_a_default_level_yields_to_the_environment_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """``default=`` is the level when neither the argument nor the environment gives one
    (the examples trace by default, and still run untraced at TRACER_ENABLE_RAY_TRACING=0);
    a bad environment value is an error whatever the default."""
    from tracer.ray import TracingLevel, resolve_level

    monkeypatch.delenv("TRACER_ENABLE_RAY_TRACING", raising=False)
    assert resolve_level() == TracingLevel.OFF
    assert resolve_level(default=TracingLevel.TIMELINE) == TracingLevel.TIMELINE
    assert resolve_level("memory", default=TracingLevel.TIMELINE) == TracingLevel.MEMORY
    monkeypatch.setenv("TRACER_ENABLE_RAY_TRACING", "0")
    assert resolve_level(default=TracingLevel.TIMELINE) == TracingLevel.OFF
    monkeypatch.setenv("TRACER_ENABLE_RAY_TRACING", "yes please")
    with pytest.raises(InvalidTracingLevelError, match="TRACER_ENABLE_RAY_TRACING"):
        resolve_level(default=TracingLevel.TIMELINE)


@pytest.mark.parametrize(
    ("value", "level"),
    [("true", 1), ("On", 1), ("yes", 1), ("false", 0), ("no", 0), ("off", 0), ("1", 1)],
)
def test_the_level_variable_takes_the_words_of_tracer_s_switches(
    value: str, level: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every other switch of tracer's takes 1/true/yes/on and 0/false/no/off: set that way,
    the level variable means on (level 1) or off, where it stopped a runner's driver."""
    from tracer.ray import resolve_level

    monkeypatch.setenv("TRACER_ENABLE_RAY_TRACING", value)
    assert resolve_level() == level


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"hello, this is a text file\n" * 10, None),
        (b"\xff" + random.Random(7).randbytes(4095), None),
        (b'{"traceEvents": []}', None),
    ],
    ids=["empty", "text", "random", "chrome-json"],
)
def test_reader_rejects_files_that_are_not_traces(
    tmp_path: Path, content: bytes, message: str | None
) -> None:
    path = tmp_path / "not-a-trace"
    path.write_bytes(content)
    with pytest.raises(TraceReadError, match=message):
        read_trace(path)


def test_reader_on_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises((TraceReadError, FileNotFoundError)):
        read_trace(tmp_path / "missing.perfetto-trace")

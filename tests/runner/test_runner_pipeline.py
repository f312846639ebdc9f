"""The reference runner on a real (local) Ray: results, errors, inputs, resource checks."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from tracer.errors import add_note
from tracer.format.reader import read_trace
from tracer.ray import layout as L
from tracer.runner import Pipeline, Stage, UnsatisfiableResourcesError

pytestmark = pytest.mark.usefixtures("ray_local")


def _jitter(x: int) -> int:
    time.sleep(random.uniform(0, 0.02))  # tasks finish out of partition order
    return x


def _square(x: int) -> int:
    return x * x


def _explode(x: int) -> int:
    if x == 3:
        raise KeyError(f"no row {x}")
    return x


class _Boom(Exception):
    """A user exception type the runner has never heard of."""


def _boom(x: int) -> int:
    raise _Boom("boom")


def test_results_in_partition_order() -> None:
    stages = [Stage("jitter", _jitter), Stage("square", _square)]
    assert Pipeline(list(range(20)), stages).run(progress=False) == [i * i for i in range(20)]


def test_results_as_refs_when_not_fetched() -> None:
    refs = Pipeline([1, 2, 3], [Stage("square", _square)]).run(progress=False, fetch=False)
    assert all(isinstance(r, ray.ObjectRef) for r in refs)
    assert ray.get(refs) == [1, 4, 9]


def test_generator_of_factories(tmp_path: Path) -> None:
    """Partitions made inside the first stage's tasks from zero-argument factories."""

    def partitions() -> Any:
        for i in range(5):
            yield lambda i=i: list(range(i))

    path = tmp_path / "gen.perfetto-trace"
    result = Pipeline(partitions(), [Stage("count", len)]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    assert result == [0, 1, 2, 3, 4]
    model = read_trace(path)
    assert not model.problems
    tasks = [s for s in model.slices if s.category == L.CAT_TASK and s.depth == 0]
    assert sorted(s.args[L.ARG_TASK_ID] for s in tasks) == [f"0-{i}" for i in range(5)]
    (stage,) = [s for s in model.slices if s.category == L.CAT_STAGE]
    assert stage.args["num_tasks"] == 5


def test_plain_values_from_a_generator() -> None:
    values = (i for i in range(4))
    assert Pipeline(values, [Stage("square", _square)]).run(progress=False) == [0, 1, 4, 9]


class _NoAddNote(KeyError):
    """An exception as Python 3.10 makes them: no ``add_note``."""

    def __getattribute__(self, name: str) -> Any:
        if name == "add_note":
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_notes_without_add_note_go_where_add_note_puts_them() -> None:
    exc = _NoAddNote("no row 3")
    assert not hasattr(exc, "add_note")
    add_note(exc, "in stage 'explode', partition 3")
    add_note(exc, "second")
    assert exc.__notes__ == ["in stage 'explode', partition 3", "second"]
    native = KeyError("no row 3")
    add_note(native, "note")
    assert native.__notes__ == ["note"]


@pytest.mark.parametrize("level", [0, 1])
def test_user_exception_reaches_the_caller(level: int, tmp_path: Path) -> None:
    path = tmp_path / "fail.perfetto-trace"
    stages = [Stage("explode", _explode), Stage("after", _square)]
    with pytest.raises(KeyError) as info:
        Pipeline(list(range(6)), stages).run(
            tracing_level=level, trace_path=path, progress=False
        )
    assert info.type is KeyError
    assert "no row 3" in str(info.value)
    assert "in stage 'explode', partition 3" in getattr(info.value, "__notes__", [])
    if level == 0:
        assert not path.exists()
        return
    # The trace is complete and shows the failed execution once, where it ran.
    model = read_trace(path)
    assert not model.problems
    assert all(s.dur is not None for s in model.slices)
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    failed = [s for s in executions if s.args.get(L.ARG_STATUS) == "failed"]
    assert [(s.name, s.args[L.ARG_TASK_ID]) for s in failed] == [("explode", "0-3")]
    assert failed[0].args[L.ARG_ERROR_TYPE] == "KeyError"
    assert "no row 3" in failed[0].args[L.ARG_ERROR]
    # The task's slice says the error too, not the note the runner added to it since.
    (task,) = [s for s in model.slices if s.category == L.CAT_TASK and s.depth == 0
               and s.args.get(L.ARG_TASK_ID) == "0-3"]
    assert task.args[L.ARG_ERROR_TYPE] == "KeyError"
    assert task.args[L.ARG_ERROR] == "KeyError: 'no row 3'", task.args
    # "after" of partition 3 never ran (its input failed): no execution for it.
    assert sorted(s.args[L.ARG_TASK_ID] for s in executions if s.name == "after") == [
        f"1-{i}" for i in range(6) if i != 3
    ]
    assert len({s.args[L.ARG_RAY_TASK_ID] for s in executions}) == len(executions)
    marks = [i for i in model.instants if i.name == L.INSTANT_TASK_FAILED]
    assert [i.args[L.ARG_TASK_ID] for i in marks] == ["0-3"]


def _two_failures(x: int) -> int:
    if x == 2:
        time.sleep(0.5)  # fails last
        raise ValueError("partition 2 failed")
    if x == 9:
        raise KeyError("partition 9 failed")  # fails first
    return x


@pytest.mark.parametrize("level", [0, 1])
def test_the_first_partitions_failure_reaches_the_caller_at_every_level(
    level: int, tmp_path: Path
) -> None:
    """Untraced, the run's ray.get of the results in order raises partition 2's error; a
    traced run finds partition 9's first, and must raise the same error all the same."""
    with pytest.raises(ValueError, match="partition 2 failed") as info:
        Pipeline(list(range(12)), [Stage("s", _two_failures)]).run(
            tracing_level=level, trace_path=tmp_path / "t.perfetto-trace", progress=False
        )
    assert info.value.__notes__ == ["in stage 's', partition 2"]


def test_user_exception_of_a_local_class() -> None:
    with pytest.raises(_Boom) as info:
        Pipeline([7], [Stage("boom", _boom)]).run(tracing_level=1, progress=False)
    assert info.value.__notes__ == ["in stage 'boom', partition 0"]


def test_unsatisfiable_request_fails_fast() -> None:
    stages = [Stage("ok", _square), Stage("huge", _square, num_cpus=64)]
    start = time.monotonic()
    with pytest.raises(UnsatisfiableResourcesError) as info:
        Pipeline([1, 2], stages).run(tracing_level=1, progress=False)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "'huge'" in message and "CPU=64" in message and "CPU=2" in message


def test_unsatisfiable_gpu_request() -> None:
    with pytest.raises(UnsatisfiableResourcesError, match="GPU=1"):
        Pipeline([1], [Stage("gpu", _square, num_gpus=1)]).run(progress=False)


@pytest.mark.parametrize(
    ("stages", "error"),
    [
        ([], "at least one stage"),
        ([Stage("a", _square), Stage("a", _square)], "unique"),
    ],
)
def test_invalid_pipelines(stages: list[Stage], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Pipeline([1], stages)


def test_invalid_stages() -> None:
    with pytest.raises(TypeError, match="callable"):
        Stage("x", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_cpus"):
        Stage("x", _square, num_cpus=-1)
    # Wrong types are said as such, not as a failed comparison deep in a module (a
    # memory size written as text), nor left to Ray's "keyword 'name' must be str" at run time.
    with pytest.raises(TypeError, match=r"memory_bytes must be a number or None, got '1 GiB' "
                                        r"\(in bytes\)"):
        Stage("x", _square, memory_bytes="1 GiB")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="num_cpus must be a number or None, got '2'"):
        Stage("x", _square, num_cpus="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name must be a string, got 3"):
        Stage(3, _square)  # type: ignore[arg-type]
    # NaN and infinities are not sizes (NaN passed, then failed inside the tracer).
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="must be a finite number >= 0"):
            Stage("x", _square, memory_bytes=bad)
    from tracer.ray.resources import as_request

    # Ray's own spelling of the memory request, in a runner's dict of options.
    assert as_request({"num_cpus": 1, "memory": 1 << 20}).memory_bytes == 1 << 20
    assert as_request({"memory_bytes": 5, "memory": 5}).memory_bytes == 5
    with pytest.raises(ValueError, match="give one"):
        as_request({"memory_bytes": 5, "memory": 6})
    import numpy as np

    assert Stage("x", _square, num_cpus=np.float32(0.5), memory_bytes=np.int64(1 << 20))

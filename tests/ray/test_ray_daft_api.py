"""The Daft-style API: a hand-written dispatch loop instrumented like Daft's RayRunner.

It uses ``dispatch_wave`` metrics, :class:`MaterializedPlanWrapper`,
:class:`RayModuleWrapper`, :class:`RayFunctionWrapper` and tasks that wrap
their body in :func:`collect_ray_task_metrics` (the actor channel).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray
from ray_trace_checks import check_runner_trace

from tracer.ray import (
    MaterializedPlanWrapper,
    RayFunctionWrapper,
    RayModuleWrapper,
    ResourceRequest,
    collect_ray_task_metrics,
    ray_tracer,
)
from tracer.ray import layout as L

pytestmark = pytest.mark.usefixtures("ray_local")

NUM_TASKS = 6


@ray.remote
def build(execution_id: str, task_id: str, stage_id: int, x: int) -> int:
    """A task body as in Daft: measured by ``collect_ray_task_metrics`` itself."""
    with collect_ray_task_metrics(execution_id, task_id, stage_id, level=1) as metrics:
        time.sleep(0.01)
        if metrics is not None:
            metrics["rows"] = x
        return x * 10


def _describe(item: tuple[str, int]) -> tuple[str, int, Any, str | None]:
    task_id, _ = item
    return task_id, 0, ResourceRequest(num_cpus=1, memory_bytes=1 << 20), "build"


def _daft_loop(
    tracer: Any, execution_id: str, submit: Callable[[Any, str, int], Any]
) -> dict[str, int]:
    """Waves of: poll the plan into a batch, dispatch it, wait, record what is ready."""
    items = [(f"t{i}", i) for i in range(NUM_TASKS)]
    plan = MaterializedPlanWrapper(iter(items), tracer, _describe)
    ray_wrapper = RayModuleWrapper(tracer)
    inflight: dict[Any, str] = {}
    results: dict[str, int] = {}
    plan_done = False
    wave = 0
    while not plan_done or inflight:
        with tracer.dispatch_wave(wave) as wave_metrics:
            batch = []
            with tracer.dispatch_batching():
                while len(batch) + len(inflight) < 2:
                    try:
                        item = next(plan)
                    except StopIteration:
                        plan_done = True
                        tracer.mark_handle_none_task()
                        break
                    tracer.mark_handle_task_add_to_batch()
                    batch.append(item)
            if batch:
                with tracer.dispatching():
                    for task_id, x in batch:
                        inflight[submit(tracer, task_id, x)] = task_id
                        tracer.mark_dispatch_task()
                tracer.count_inflight_tasks(len(inflight))
            with tracer.awaiting(1, 5.0) as update:
                ready, not_ready = ray_wrapper.wait(
                    dict(inflight), list(inflight), num_returns=1, timeout=5.0
                )
                update(num_ready=len(ready))
            for ref in not_ready:
                tracer.task_not_ready(inflight[ref])
            for ref in ready:
                results[inflight.pop(ref)] = ray.get(ref)
                tracer.mark_handle_materialized_result()
            tracer.count_inflight_tasks(len(inflight))
            wave_metrics(dispatched=len(batch), received=len(ready), daft_metric="x")
        wave += 1
    tracer.stage_done(0)
    return results


def _check(path: Path) -> None:
    rt = check_runner_trace(path, {"build": NUM_TASKS})
    waves = [s for s in rt.loop_slices if s.name == L.SLICE_WAVE]
    assert {s.args["daft_metric"] for s in waves} == {"x"}
    assert sum(s.args["dispatched"] for s in waves) == NUM_TASKS
    polls = [s for s in rt.loop_slices if s.name == L.SLICE_PLAN_POLLING]
    # One poll per task, and a last one that ended the plan (StopIteration: no item type).
    assert [s.args.get("next_item_type") for s in polls] == ["tuple"] * NUM_TASKS + [None]
    for task in rt.task_slices:
        assert task.args[L.ARG_INSTRUCTIONS] == "build"
        assert task.args[L.ARG_RESOURCE_REQUEST] == {
            "num_cpus": 1, "num_gpus": 0, "memory_bytes": 1 << 20,
        }
    for e in rt.executions:
        assert e.args["memory_requested"] == 1 << 20
    (execution,) = [s for s in rt.loop_slices if s.depth == 0]
    assert execution.args["lost_measurements"] == 0


def test_daft_port_wrapped_calls_measured_once(tmp_path: Path) -> None:
    """RayFunctionWrapper plus collect_ray_task_metrics in the task: one execution per task."""
    path = tmp_path / "daft.perfetto-trace"

    def submit(tracer: Any, task_id: str, x: int) -> Any:
        fn = RayFunctionWrapper.wrap(build).with_tracing(tracer, task_id)
        return fn.options(num_cpus=1, memory=1 << 20).remote(tracer.execution_id, task_id, 0, x)

    with ray_tracer("daft-wrapped", level=1, path=path, metrics_actor=True) as tracer:
        results = _daft_loop(tracer, "daft-wrapped", submit)
    assert results == {f"t{i}": 10 * i for i in range(NUM_TASKS)}
    _check(path)


def test_daft_actor_channel(tmp_path: Path) -> None:
    """Plain Ray calls, measured only by collect_ray_task_metrics through the metrics actor."""
    path = tmp_path / "daft-actor.perfetto-trace"

    def submit(tracer: Any, task_id: str, x: int) -> Any:
        tracer.task_dispatched(task_id)
        return build.options(num_cpus=1, memory=1 << 20).remote(
            tracer.execution_id, task_id, 0, x
        )

    with ray_tracer("daft-actor", level=1, path=path, metrics_actor=True) as tracer:
        results = _daft_loop(tracer, "daft-actor", submit)
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
        assert "tracer-metrics-daft-actor" in names
    assert results == {f"t{i}": 10 * i for i in range(NUM_TASKS)}
    _check(path)
    # The actor is gone with the execution.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
        if "tracer-metrics-daft-actor" not in names:
            break
        time.sleep(0.1)
    assert "tracer-metrics-daft-actor" not in names


@ray.remote
def build_at_the_drivers_level(execution_id: str, task_id: str, stage_id: int, x: int) -> int:
    """A task body that names no level and sees no $TRACER_ENABLE_RAY_TRACING."""
    import os

    os.environ.pop("TRACER_ENABLE_RAY_TRACING", None)
    with collect_ray_task_metrics(execution_id, task_id, stage_id) as metrics:
        time.sleep(0.01)
        if metrics is not None:
            metrics["rows"] = x
        return x * 10


def test_daft_actor_channel_with_the_level_as_an_argument(tmp_path: Path) -> None:
    """``ray_tracer(level=1)`` traces the tasks that measure themselves too: they find the
    execution's metrics actor (they used to record nothing, and the trace called every
    task's measurements lost)."""
    path = tmp_path / "daft-argument.perfetto-trace"

    def submit(tracer: Any, task_id: str, x: int) -> Any:
        tracer.task_dispatched(task_id)
        return build_at_the_drivers_level.options(num_cpus=1, memory=1 << 20).remote(
            tracer.execution_id, task_id, 0, x
        )

    with ray_tracer("daft-argument", level=1, path=path, metrics_actor=True) as tracer:
        results = _daft_loop(tracer, "daft-argument", submit)
    assert results == {f"t{i}": 10 * i for i in range(NUM_TASKS)}
    _check(path)
    # Untraced, the same task records nothing (no actor to find).
    assert ray.get(build_at_the_drivers_level.remote("not-traced", "t0", 0, 1)) == 10


def test_collect_ray_task_metrics_off_without_level(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACER_ENABLE_RAY_TRACING", raising=False)
    with collect_ray_task_metrics("none", "t0", 0) as metrics:
        assert metrics is None


@ray.remote(num_returns=2)
def split_pair(x: int) -> tuple[int, int]:
    return x, -x


def test_traced_calls_with_several_returns(tmp_path: Path) -> None:
    """A remote function's own returns come back as they would untraced; its run is measured."""
    from tracer.format import read_trace

    path = tmp_path / "returns.perfetto-trace"
    with ray_tracer("returns", level=1, path=path) as tracer:
        outputs = {}
        for i, returns in enumerate([None, 3, 1]):
            task_id = f"r{i}"
            tracer.task_created(task_id, 0, ResourceRequest(num_cpus=1), "split")
            fn = RayFunctionWrapper.wrap(split_pair).with_tracing(tracer, task_id)
            if returns is None:  # the function's own num_returns=2
                refs = fn.remote(7)
            elif returns == 3:
                refs = RayFunctionWrapper.wrap(triple).with_tracing(tracer, task_id).options(
                    num_returns=3
                ).remote(7)
            else:  # overridden down to one return: the pair as one value
                refs = fn.options(num_returns=1).remote(7)
            outputs[task_id] = ray.get(refs)
            tracer.tasks_received_as_ready([task_id])
        tracer.stage_done(0)
    assert outputs == {"r0": [7, -7], "r1": [7, 8, 9], "r2": (7, -7)}
    executions = [s for s in read_trace(path).slices if s.category == L.CAT_EXECUTION]
    assert sorted(s.args[L.ARG_TASK_ID] for s in executions) == ["r0", "r1", "r2"]


def test_a_function_given_with_rays_own_options_is_traced(tmp_path: Path) -> None:
    """``RayFunctionWrapper.wrap(fn.options(...))``, Ray's own idiom, is traced with those
    options (its tasks ran untraced, without a word: the wrapper could not reach the
    function inside Ray's options object); a wrapper's own options still win."""
    from tracer.format import read_trace

    path = tmp_path / "options.perfetto-trace"
    with ray_tracer("ray-options", level=1, path=path) as tracer:
        got = []
        for i, extra in enumerate([{}, {"num_returns": 1}]):
            task_id = f"o{i}"
            tracer.task_created(task_id, 0, ResourceRequest(num_cpus=1), "split")
            wrapped = RayFunctionWrapper.wrap(split_pair.options(num_cpus=1, memory=8 << 20))
            got.append(ray.get(wrapped.with_tracing(tracer, task_id).options(**extra).remote(3)))
            tracer.tasks_received_as_ready([task_id])
        tracer.stage_done(0)
    assert got == [[3, -3], (3, -3)]
    executions = sorted((s for s in read_trace(path).slices if s.category == L.CAT_EXECUTION),
                        key=lambda s: s.args[L.ARG_TASK_ID])
    assert [s.args[L.ARG_TASK_ID] for s in executions] == ["o0", "o1"]
    for e in executions:  # measured, with the options Ray was given
        assert e.args[L.ARG_MEMORY_PEAK] > 0
        assert e.args[L.ARG_ASSIGNED_RESOURCES]["memory"] == 8 << 20


@ray.remote
def triple(x: int) -> tuple[int, int, int]:
    return x, x + 1, x + 2


@ray.remote
def count_up(n: int) -> Any:
    for i in range(n):  # noqa: UP028 (Ray calls send() on the generator: range has none)
        yield i


@ray.remote(num_returns=2)
def count_up_two(n: int) -> Any:
    for i in range(n):  # noqa: UP028
        yield i


@ray.remote
def count_up_measured(execution_id: str, task_id: str, n: int) -> Any:
    """A generator that measures itself: its measurements reach a metrics actor."""
    with collect_ray_task_metrics(execution_id, task_id, 0, level=1):
        for i in range(n):  # noqa: UP028
            yield i


@ray.remote
class _Counter:
    def count(self, n: int) -> Any:
        for i in range(n):  # noqa: UP028
            yield i


@ray.remote
class _AsyncCounter:
    async def count(self, n: int) -> Any:
        for i in range(n):
            yield i


#: task id: (what to call, the num_returns given in ``.options()`` or "" for none, n).
#: Every form of num_returns on a generator: the default (streaming), an int (Ray
#: runs the generator and its first values are the returns: 1 gives the first value
#: alone, too few values is Ray's error), "streaming", "dynamic"; set in
#: ``@ray.remote`` or in ``.options()``; and actors' generator methods, sync and async.
_GENERATOR_CASES: dict[str, tuple[str, Any, int]] = {
    "default": ("count_up", "", 3),
    "one": ("count_up", 1, 3),
    "three": ("count_up", 3, 3),
    "too-few": ("count_up", 4, 3),
    "streaming": ("count_up", "streaming", 3),
    "dynamic": ("count_up", "dynamic", 3),
    "decorator-two": ("count_up_two", "", 2),
    "decorator-two-too-few": ("count_up_two", "", 1),
    "decorator-then-one": ("count_up_two", 1, 2),
    "decorator-then-streaming": ("count_up_two", "streaming", 2),
    "actor-default": ("counter", "", 3),
    "actor-two": ("counter", 2, 2),
    "async-actor-default": ("async_counter", "", 3),
    "async-actor-two": ("async_counter", 2, 2),
}


def _outcome(kind: Any, call: Callable[[], Any]) -> Any:
    """What the caller gets, materialised: the values, or Ray's error in words."""
    try:
        ref = call()
        if kind == "dynamic":  # one ref to a generator of refs
            return [ray.get(r) for r in ray.get(ref)]
        if isinstance(ref, ray.ObjectRefGenerator):  # streaming
            return [ray.get(r) for r in ref]
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        return f"{type(exc.cause).__name__}: {exc.cause}"


@pytest.mark.filterwarnings("ignore")  # Ray deprecates "dynamic"
@pytest.mark.parametrize(
    ("level", "channel"),
    [(0, "returns"), (1, "returns"), (2, "returns"), (1, "ray_events"), (1, "metrics_actor")],
)
def test_generator_tasks_run_as_they_would_untraced(
    level: int, channel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generator's values are Ray's to take (streamed, or run for an int num_returns):
    there is no last return value for the measurements to ride on, so such a task
    runs untraced inside, and shows in the trace from the driver's side. It used to
    fail with "cannot pickle 'generator' object" (no num_returns, or 1), "object of
    type 'generator' has no len()" (an int num_returns above 1), or at ``remote()``
    on ``num_returns="streaming"``. With a metrics actor, a task not measured by the
    wrapper is one that may measure itself (the Daft pattern): a generator that does
    is drawn from the actor's report, the others' measurements are counted lost."""
    from tracer.format import read_trace

    monkeypatch.setenv("TRACER_EXECUTIONS", "ray_events" if channel == "ray_events" else "returns")
    functions = {
        "count_up": count_up, "count_up_two": count_up_two,
        "counter": _Counter.remote().count, "async_counter": _AsyncCounter.remote().count,
    }

    def untraced(name: str, num_returns: Any, n: int) -> Any:
        fn = functions[name]
        return (fn.options(num_returns=num_returns) if num_returns != "" else fn).remote(n)

    expected = {
        task_id: _outcome(case[1], lambda c=case: untraced(*c))
        for task_id, case in _GENERATOR_CASES.items()
    }
    assert expected["one"] == 0 and expected["three"] == [0, 1, 2]  # Ray's, for the record
    assert expected["too-few"] == "ValueError: Task returned 3 objects, but num_returns=4."
    path = tmp_path / "generators.perfetto-trace"
    outputs = {}
    with ray_tracer(
        "generators", level=level, path=path, metrics_actor=channel == "metrics_actor"
    ) as tracer:
        for task_id, (name, num_returns, n) in _GENERATOR_CASES.items():
            tracer.task_created(task_id, 0, ResourceRequest(num_cpus=1), name)
            fn = RayFunctionWrapper.wrap(functions[name])
            if num_returns != "":
                fn = fn.options(num_returns=num_returns)
            traced = fn.with_tracing(tracer, task_id)
            outputs[task_id] = _outcome(num_returns, lambda t=traced, n=n: t.remote(n))
            tracer.tasks_received_as_ready([task_id])
        if channel == "metrics_actor":
            tracer.task_created("measured", 0, ResourceRequest(num_cpus=1), "count_up_measured")
            measured = RayFunctionWrapper.wrap(count_up_measured).with_tracing(tracer, "measured")
            assert [ray.get(r) for r in measured.remote(tracer.execution_id, "measured", 3)] == [
                0, 1, 2,
            ]
            tracer.tasks_received_as_ready(["measured"])
        tracer.stage_done(0)
    assert outputs == expected
    if level:
        model = read_trace(path, strict=True)
        tasks = [s for s in model.slices if s.category == L.CAT_TASK and s.depth == 0]
        measured_ids = ["measured"] if channel == "metrics_actor" else []
        assert sorted(s.args[L.ARG_TASK_ID] for s in tasks) == sorted(
            [*_GENERATOR_CASES, *measured_ids]
        )
        assert all(L.ARG_STATUS not in s.args for s in tasks)
        executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
        assert [s.args[L.ARG_TASK_ID] for s in executions] == measured_ids
        (run,) = [s for s in model.slices if s.name == L.SLICE_EXECUTION]
        # Without an actor none is expected; with one, each that did not measure itself.
        lost = len(_GENERATOR_CASES) if channel == "metrics_actor" else 0
        assert run.args[L.ARG_LOST_MEASUREMENTS] == lost


@ray.remote
class _Adder:
    def add(self, x: int) -> int:
        return x + 100


@ray.remote(num_returns=2)
def _three_for_two(x: int) -> tuple[int, int, int]:
    return x, x, x


@ray.remote(num_returns=2)
def _one_for_two(x: int) -> int:
    return x


@pytest.mark.parametrize("level", [0, 1])
def test_what_ray_runs_or_refuses_untraced_it_runs_or_refuses_alike_traced(
    level: int, tmp_path: Path
) -> None:
    """An actor's method through the wrapper (it failed with AttributeError: no
    `_function`), and a multi-return task that returns the wrong number of values
    (Ray's count included the measurements: "returned 4 objects, but num_returns=3")."""
    adder = _Adder.remote()
    errors: dict[str, str] = {}
    with ray_tracer("odd calls", level=level, path=tmp_path / "odd.perfetto-trace") as tracer:
        tracer.task_created("a", 0, ResourceRequest(num_cpus=1), "add")
        ref = RayFunctionWrapper.wrap(adder.add).with_tracing(tracer, "a").remote(1)
        assert ray.get(ref) == 101
        tracer.tasks_received_as_ready(["a"])
        for task_id, fn in (("three", _three_for_two), ("one", _one_for_two)):
            tracer.task_created(task_id, 0, ResourceRequest(num_cpus=1), task_id)
            refs = RayFunctionWrapper.wrap(fn).with_tracing(tracer, task_id).remote(1)
            with pytest.raises(ray.exceptions.RayTaskError) as info:
                ray.get(refs)
            errors[task_id] = f"{type(info.value.cause).__name__}: {info.value.cause}"
            tracer.tasks_received_as_ready([task_id])
    assert errors == {
        "three": "ValueError: Task returned 3 objects, but num_returns=2.",
        "one": "TypeError: object of type 'int' has no len()",
    }


@ray.remote
def add_one(x: int) -> int:
    time.sleep(0.05)
    return x + 1


def test_stage_done_too_early_keeps_the_stage_whole(tmp_path: Path) -> None:
    """stage_done while a task is in flight, then another task of the stage: the stage
    slice used to be written at once, zero-long, and the later task's flow had no start."""
    from tracer.format import read_trace

    path = tmp_path / "early.perfetto-trace"
    with ray_tracer("early", level=1, path=path) as tracer:
        tracer.task_created("0-0", 0, ResourceRequest(num_cpus=1), "inc")
        a = RayFunctionWrapper.wrap(add_one).with_tracing(tracer, "0-0").remote(1)
        tracer.stage_done(0)  # too early: 0-0 is in flight
        tracer.task_created("0-1", 0, ResourceRequest(num_cpus=1), "inc")
        b = RayFunctionWrapper.wrap(add_one).with_tracing(tracer, "0-1").remote(2)
        assert ray.get([a, b]) == [2, 3]
        tracer.tasks_received_as_ready(["0-0", "0-1"])
        tracer.stage_done(0)
        tracer.task_created("0-2", 0, ResourceRequest(num_cpus=1), "inc")  # after the end
        c = RayFunctionWrapper.wrap(add_one).with_tracing(tracer, "0-2").remote(3)
        assert ray.get(c) == 4
        tracer.tasks_received_as_ready(["0-2"])
    model = read_trace(path, strict=True)
    stages = sorted((s for s in model.slices if s.category == L.CAT_STAGE), key=lambda s: s.ts)
    assert [s.args["num_tasks"] for s in stages] == [2, 1]  # the stage went on: a second slice
    tasks = {s.args[L.ARG_TASK_ID]: s for s in model.slices
             if s.category == L.CAT_TASK and s.depth == 0}
    assert stages[0].ts + (stages[0].dur or 0) >= tasks["0-1"].ts + (tasks["0-1"].dur or 0)
    assert len(model.flows) == 3  # one arrow per execution, each from its stage slice


def test_dispatch_recorded_by_the_runner_then_by_the_wrapper(tmp_path: Path) -> None:
    """The task used to run unmeasured: the wrapper's own dispatch call got no context."""
    from tracer.format import read_trace

    path = tmp_path / "twice.perfetto-trace"
    with ray_tracer("twice", level=1, path=path) as tracer:
        tracer.task_created("0-0", 0, ResourceRequest(num_cpus=1), "inc")
        tracer.task_dispatched("0-0")
        ref = RayFunctionWrapper.wrap(add_one).with_tracing(tracer, "0-0").remote(1)
        assert ray.get(ref) == 2
        tracer.tasks_received_as_ready(["0-0"])
        tracer.stage_done(0)
    model = read_trace(path, strict=True)
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    assert [s.args[L.ARG_TASK_ID] for s in executions] == ["0-0"]
    dispatched = [s for s in model.slices if s.name == L.SLICE_DISPATCHED]
    assert len(dispatched) == 1


def test_a_noop_task_end_without_a_start_is_ignored(tmp_path: Path) -> None:
    """It used to end the loop's enclosing slice, and every later end was off by one."""
    from tracer.format import read_trace

    path = tmp_path / "noop.perfetto-trace"
    with ray_tracer("noop", level=1, path=path) as tracer, tracer.dispatch_wave(0):
        tracer.mark_noop_task_end()
        tracer.mark_noop_task_start()
        tracer.mark_noop_task_end()
        tracer.mark_noop_task_end()
    model = read_trace(path, strict=True)
    names = sorted(s.name for s in model.slices)
    assert names == sorted([L.SLICE_EXECUTION, L.SLICE_WAVE, L.SLICE_NOOP_TASK])
    (run,) = [s for s in model.slices if s.name == L.SLICE_EXECUTION]
    assert run.args[L.ARG_LOST_MEASUREMENTS] == 0

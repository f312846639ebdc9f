"""The Ray-version differences of the Ray Data integration (its _compat module).

The installed Ray's own calls are exercised by the other Ray Data tests; here
each difference is checked with the call shapes of the versions that differ
(read in their sources), on plain stand-ins for Ray Data's small records.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("pyarrow", reason="Ray Data needs pip install -e '.[raydata]'")

import ray

from tracer.integrations.ray_data import _compat as compat


def test_versions_below_the_floor_are_named() -> None:
    assert compat.unsupported_reason("2.50.0") is None
    assert compat.unsupported_reason("2.60.1") is None
    assert compat.unsupported_reason("3.0.0") is None
    reason = compat.unsupported_reason("2.49.2")
    assert reason is not None and "2.49.2" in reason and "2.50 or newer" in reason
    assert compat.unsupported_reason(ray.__version__) is None


def test_on_task_submitted_before_and_after_2_54() -> None:
    bundle = object()
    assert compat.submitted_args((3, bundle), {}) == (3, bundle, None)  # 2.50-2.53
    tid = ray.TaskID.nil()
    assert compat.submitted_args((4, bundle), {"task_id": tid}) == (4, bundle, None)  # nil id
    fake = SimpleNamespace(is_nil=lambda: False, hex=lambda: "ab12")
    assert compat.submitted_args((5, bundle), {"task_id": fake}) == (5, bundle, "ab12")  # 2.54+
    assert compat.submitted_args((), {"task_index": 6, "inputs": bundle}) == (6, bundle, None)


def test_on_task_finished_before_and_after_2_55() -> None:
    error = ValueError("x")
    assert compat.finished_args((1, None), {}) == (1, None, None)  # 2.50-2.54
    assert compat.finished_args((1, error), {}) == (1, error, None)
    stats = SimpleNamespace(task_wall_time_s=0.1, max_uss_bytes=123)
    assert compat.finished_args((2, None, stats, None), {}) == (2, None, 123)  # 2.55+
    assert compat.finished_args((), {"task_index": 2, "exception": None,
                                     "task_exec_stats": stats}) == (2, None, 123)


def test_a_tasks_uss_peak_on_block_metadata_in_both_places() -> None:
    old = SimpleNamespace(exec_stats=SimpleNamespace(max_uss_bytes=50))  # up to 2.54
    new = SimpleNamespace(exec_stats=SimpleNamespace(), task_exec_stats=SimpleNamespace(
        max_uss_bytes=70))  # 2.57+
    assert compat.uss_of_output(SimpleNamespace(metadata=[old])) == 50
    assert compat.uss_of_output(SimpleNamespace(metadata=[old, new])) == 70
    assert compat.uss_of_output(SimpleNamespace(metadata=[])) is None
    unknown = SimpleNamespace(exec_stats=SimpleNamespace(max_uss_bytes=0))  # not measured
    assert compat.uss_of_output(SimpleNamespace(metadata=[unknown])) is None


def test_registration_classes_since_2_55_instances_before() -> None:
    class Callback:
        pass

    new_style = SimpleNamespace(custom_execution_callback_classes=[])
    compat.register_callback(new_style, Callback)
    compat.register_callback(new_style, Callback)
    assert new_style.custom_execution_callback_classes == [Callback]
    compat.unregister_callback(new_style, Callback)
    assert new_style.custom_execution_callback_classes == []


def test_the_start_hook_is_installed_once() -> None:
    from ray.data._internal.execution.operators.map_operator import MapOperator

    from tracer.integrations.ray_data.callback import _on_operator_start

    compat.install_start_hook(_on_operator_start)
    hooked = MapOperator.__dict__["start"]
    compat.install_start_hook(_on_operator_start)
    assert MapOperator.__dict__["start"] is hooked and hooked.__tracer_hook__


def test_a_hash_shuffle_operators_task_hooks_in_every_version() -> None:
    """Its shuffle tasks' metrics: ``shuffle_metrics`` up to 2.53, ``_shuffle_metrics``
    in 2.54 (``metrics`` is then the base operator's), ``metrics`` from 2.55."""
    shuffle = SimpleNamespace(on_task_submitted=lambda *a, **k: None)
    base = SimpleNamespace(on_task_submitted=lambda *a, **k: None)
    assert compat.op_metrics(SimpleNamespace(shuffle_metrics=shuffle, metrics=base)) is shuffle
    assert compat.op_metrics(SimpleNamespace(_shuffle_metrics=shuffle, metrics=base)) is shuffle
    assert compat.op_metrics(SimpleNamespace(metrics=shuffle)) is shuffle


def test_the_round_wait_is_hooked_where_it_is_defined() -> None:
    """``fetch_until_complete`` is inherited by every bar (from ``AbstractProgressBar`` in
    2.52 and 2.53, ``BaseProgressBar`` from 2.54): the class hooked must define it."""
    bar = compat.progress_bar_class()
    assert bar is not None and "fetch_until_complete" in vars(bar)


def test_a_rounds_name_from_every_kind_of_progress_bar() -> None:
    """The name of the round an all-to-all operator waits for, whatever bar Ray Data drew
    it with: 2.60's logging bar (stdout not a terminal: logs, CI) says "" as its
    description, and its tqdm bar draws the name as a tree; the trace said
    "LoggingSubProgressBar" and "  *- Shuffle Map" (fresh user's review 6)."""
    plain = SimpleNamespace(get_description=lambda: "Sort Sample")
    assert compat.round_name(plain) == "Sort Sample"
    tree = SimpleNamespace(get_description=lambda: "  *- Shuffle Map")
    assert compat.round_name(tree) == "Shuffle Map"
    logging_bar = SimpleNamespace(get_description=lambda: "", _name="Shuffle Reduce")
    assert compat.round_name(logging_bar) == "Shuffle Reduce"
    assert compat.round_name(SimpleNamespace(_desc="Split Repartition")) == "Split Repartition"
    try:  # Ray 2.60's own classes, where this Ray has them
        from ray.data._internal.progress.logging_progress import LoggingSubProgressBar
        from ray.data._internal.progress.tqdm_progress import TqdmSubProgressBar
    except ImportError:
        return
    assert compat.round_name(LoggingSubProgressBar("Shuffle Map", 4)) == "Shuffle Map"
    drawn = TqdmSubProgressBar("  *- Shuffle Reduce", 4, "row", enabled=False)
    assert compat.round_name(drawn) == "Shuffle Reduce"

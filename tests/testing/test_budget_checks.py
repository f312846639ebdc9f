"""The traced block and its assertions on level-2 traces of known memory (no Ray).

The traces are written through RunTimeline (``budget_traces``) to tracer's
default path, as a runner inside the block would: what the block finds is
what ``TRACER_TRACE_DIR`` redirected there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import budget_traces as B
import pytest

from tracer.ray import default_trace_dir
from tracer.sizes import InvalidSizeError
from tracer.testing import MemoryBudgetError, TracedMemoryError
from tracer.testing.run import LEVEL_ENV_VAR, TRACE_DIR_ENV_VAR, TracedMemory, TracedRun

MIB = B.MIB


def traced(tmp_path: Path, *traces: Sequence[B.Task], level: int = 2) -> TracedRun:
    with TracedMemory(tmp_path / "blocks") as run:
        for i, tasks in enumerate(traces):
            B.write(tasks, level=level, execution_id=f"run{i}")
    return run


def test_the_block_redirects_default_traces_and_restores_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEVEL_ENV_VAR, "1")
    monkeypatch.delenv(TRACE_DIR_ENV_VAR, raising=False)
    tracing = TracedMemory(tmp_path / "blocks")
    with tracing as run:
        assert os.environ[LEVEL_ENV_VAR] == "2"
        assert default_trace_dir() == run.folder == tmp_path / "blocks" / "block-0"
        B.write([("map", 4 * MIB, 2 * MIB)])
        with pytest.raises(TracedMemoryError, match="has not ended"):
            run.tasks  # noqa: B018
    assert os.environ[LEVEL_ENV_VAR] == "1" and TRACE_DIR_ENV_VAR not in os.environ
    (task,) = run.tasks
    assert (task.stage, task.task_id, task.requested, task.peak) == ("map", "0-0", 4 * MIB, 2 * MIB)
    assert (task.node, task.worker, task.oom_killed) == (B.NODE, "worker 11", False)
    assert run.traces == sorted(run.folder.glob("*.perfetto-trace"))
    # A second block is a run of its own.
    with tracing as second:
        B.write([("other", None, 1)])
    assert list(second.stages) == ["other"] and list(run.stages) == ["map"]
    assert tracing.runs == [run, second]


def test_within_request_names_the_tasks_over_it_worst_first(tmp_path: Path) -> None:
    run = traced(tmp_path, [("map", 4 * MIB, 5 * MIB), ("map", 4 * MIB, 16 * MIB),
                            ("map", 4 * MIB, 3 * MIB), ("reduce", 64 * MIB, MIB)])
    with pytest.raises(MemoryBudgetError) as info:
        run.assert_within_request()
    message = str(info.value)
    assert message.startswith("2 of 4 task(s) used more than their memory request")
    rows = re.findall(rf"^  map +(0-\d) +0 +{re.escape(B.NODE)} +(worker \d+) +(.+?)$", message,
                      re.MULTILINE)
    assert [(task, worker, " ".join(rest.split())) for task, worker, rest in rows] == [
        ("0-1", "worker 12", "4 MiB 16 MiB 4.00x"),
        ("0-0", "worker 11", "4 MiB 5 MiB 1.25x"),
    ]
    assert "'map': 20971520 bytes (20 MiB)" in message
    # The plugin sees any runner's tasks: the hint names where each sets its request.
    assert "Stage(memory_bytes=...) in tracer's runner, memory= in Ray's .options()" in message
    assert str(run.traces[0]) in message
    run.assert_within_request(factor=4.0)  # 16 MiB is 4x its request
    with pytest.raises(MemoryBudgetError, match=r"3\.9x their memory request"):
        run.assert_within_request(factor=3.9)
    run.assert_within_request(stages="reduce")
    with pytest.raises(MemoryBudgetError):
        run.assert_within_request(stages=["reduce", "map"])


def test_stage_budgets_max_and_percentiles(tmp_path: Path) -> None:
    run = traced(tmp_path, [("map", None, (i + 1) * MIB) for i in range(20)])
    assert run.stage_peak("map") == 20 * MIB
    assert run.stage_peak("map", "p95") == 19 * MIB  # nearest rank: the 19th of 20
    assert run.stage_peak("map", "p50") == 10 * MIB
    run.assert_stage_peak("map", "20 MiB")
    run.assert_stage_peak("map", 19 * MIB, stat="p95")
    with pytest.raises(MemoryBudgetError) as info:
        run.assert_stage_peak("map", "19 MiB")
    assert "stage 'map': max peak 20 MiB (20,971,520 B) over its budget 19 MiB" in str(info.value)
    with pytest.raises(MemoryBudgetError) as info:
        run.assert_stage_peak("map", "18.5 MiB", stat="P95")
    message = str(info.value)
    assert "p95 peak 19 MiB" in message
    # The tasks over the budget, worst first: two of them.
    assert re.findall(r"^  map +(0-\d+) ", message, re.MULTILINE) == ["0-19", "0-18"]


def test_the_message_lists_ten_tasks_at_most(tmp_path: Path) -> None:
    run = traced(tmp_path, [("map", MIB, (i + 2) * MIB) for i in range(25)])
    with pytest.raises(MemoryBudgetError) as info:
        run.assert_within_request()
    message = str(info.value)
    assert message.startswith("25 of 25 task(s)")
    assert "... and 15 more" in message
    shown = re.findall(r"^  map +(0-\d+) ", message, re.MULTILINE)
    assert shown == [f"0-{i}" for i in range(24, 14, -1)]
    # Nearest rank: p95 of 25 is the 24th (23.75 rounded up), p50 the 13th.
    assert run.stage_peak("map", "p95") == 25 * MIB
    assert run.stage_peak("map", "p50") == 14 * MIB


def test_oom_kills_fail_every_assertion_that_covers_them(tmp_path: Path) -> None:
    # Killed below its request (the node ran out: its neighbours' fault, or not): a kill
    # fails the check whatever the numbers.
    run = traced(tmp_path, [("map", 4 * MIB, 2 * MIB), ("reduce", 64 * MIB, -48 * MIB),
                            ("reduce", 64 * MIB, 10 * MIB)])
    (killed,) = [t for t in run.tasks if t.oom_killed]
    assert (killed.task_id, killed.peak, killed.killed_at) == ("1-1", None, 48 * MIB)
    for check in (
        run.assert_no_oom_kill,
        run.assert_within_request,
        lambda: run.assert_stage_peak("reduce", "1 GiB"),  # within budget, still killed
    ):
        with pytest.raises(MemoryBudgetError) as info:
            check()
        message = str(info.value)
        assert "killed by Ray's OOM killer" in message
        assert "1-1" in message and "48 MiB at kill" in message
    run.assert_stage_peak("map", "4 MiB")
    run.assert_within_request(stages="map")


def test_nothing_to_check_is_an_error_not_a_pass(tmp_path: Path) -> None:
    with pytest.raises(TracedMemoryError, match="the block wrote no trace"), \
            TracedMemory(tmp_path / "a"):
        pass
    with pytest.raises(TracedMemoryError, match="hold no task"):
        traced(tmp_path / "b", [])
    with pytest.raises(TracedMemoryError, match=r"none of the block's 2 task\(s\) was measured"):
        traced(tmp_path / "c", [("map", MIB, None), ("map", MIB, None)])
    with pytest.raises(TracedMemoryError, match="written at tracing level 1, not 2"):
        traced(tmp_path / "d", [("map", MIB, MIB)], level=1)
    run = traced(tmp_path / "e", [("map", None, MIB), ("reduce", MIB, None), ("reduce", MIB, 1)])
    with pytest.raises(TracedMemoryError, match=r"no measured task of stage\(s\) 'map' "
                       r"requested memory \(the request is Stage\(memory_bytes=\.\.\.\)"):
        run.assert_within_request(stages="map")
    with pytest.raises(TracedMemoryError, match=r"no stage named 'mpa'.*stages: 'map', 'reduce'"):
        run.assert_stage_peak("mpa", "1 GiB")
    with pytest.raises(TracedMemoryError, match="no stage named 'mpa'"):
        run.assert_within_request(stages=["map", "mpa"])
    with pytest.raises(TracedMemoryError, match="stages is empty"):
        run.assert_within_request(stages=[])
    for stat in ("avg", "p0", "p101", "95", ""):
        with pytest.raises(TracedMemoryError, match="stat must be 'max' or a percentile"):
            run.assert_stage_peak("map", "1 GiB", stat=stat)
    for factor in (0, -1, float("nan"), "2", True):
        with pytest.raises(TracedMemoryError, match="factor must be a positive"):
            run.assert_within_request(factor=factor)
    with pytest.raises(InvalidSizeError, match="budget '1 GB per task' is not a size"):
        run.assert_stage_peak("map", "1 GB per task")


def test_blocks_do_not_nest_and_an_error_inside_keeps_its_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRACE_DIR_ENV_VAR, raising=False)
    monkeypatch.delenv(LEVEL_ENV_VAR, raising=False)
    tracing = TracedMemory(tmp_path)
    with pytest.raises(TracedMemoryError, match="wrote no trace"), tracing:  # noqa: SIM117
        with pytest.raises(TracedMemoryError, match="do not nest"), TracedMemory(tmp_path / "b"):
            pass
    assert TRACE_DIR_ENV_VAR not in os.environ and LEVEL_ENV_VAR not in os.environ

    class Boom(Exception):
        pass

    with pytest.raises(Boom) as info, tracing:
        B.write([("map", MIB, MIB)])
        raise Boom("the pipeline failed")
    folder = tracing.runs[-1].folder
    assert getattr(info.value, "__notes__", []) == [
        f"traced memory: the block's traces are in {folder}"
    ]
    assert TRACE_DIR_ENV_VAR not in os.environ and LEVEL_ENV_VAR not in os.environ
    assert len(list(folder.glob("*.perfetto-trace"))) == 1


def test_summary(tmp_path: Path) -> None:
    run = traced(tmp_path, [("map", 4 * MIB, 2 * MIB), ("map", 4 * MIB, 6 * MIB),
                            ("reduce", None, None), ("reduce", None, MIB)])
    assert run.summary().splitlines() == [
        "stage   tasks  measured  requested  peak p50  peak max",
        "map     2      2         4 MiB      2 MiB     6 MiB",
        "reduce  2      1         -          1 MiB     1 MiB",
    ]
    assert repr(run) == "<TracedRun 4 tasks in 1 trace(s)>"


def test_two_traces_in_one_block(tmp_path: Path) -> None:
    run = traced(tmp_path, [("map", MIB, MIB)], [("map", MIB, 3 * MIB), ("join", None, 1)])
    assert len(run.traces) == 2
    assert [len(v) for v in run.stages.values()] == [2, 1]
    with pytest.raises(MemoryBudgetError) as info:
        run.assert_within_request()
    (trace,) = [t for t in run.traces if str(t) in str(info.value)]
    assert "run1" in trace.name  # the trace of the task over its request, not the other


def test_a_subprocess_started_in_the_block_traces_there_at_level_2(tmp_path: Path) -> None:
    code = (
        "from tracer.ray import default_trace_dir, resolve_level; "
        "print(default_trace_dir(), int(resolve_level()))"
    )
    with pytest.raises(TracedMemoryError, match="wrote no trace"), \
            TracedMemory(tmp_path) as run:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, timeout=60).stdout.split()
    assert out == [str(run.folder), "2"]

"""Runner traces in the real Perfetto UI: what a user sees, top-down.

Each test has a trace written with real Ray (the mock workload of examples/ at levels 2 and
1, both written by one run of the example's driver; a two-node run; a run with failures),
opens it in Perfetto's own UI through ../shared/perfetto-ui/ui-screenshot.sh and checks the
UI's track tree (names, nesting, order, renderers, counts) against the trace, and that the UI
loaded it without a dialog, an import error or a data loss. Skipped where that folder is
absent. The screenshots stay in .ui-screenshots/<test>/ (ui_shot.OUT_ROOT; named in any
failure).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from both_nodes import meet
from ui_layout_checks import COUNTER, check_runner_layout
from ui_shot import out_dir, render, script

from tracer.cli.open_trace import startup_query
from tracer.format import read_trace
from tracer.ray import layout as L
from tracer.ray import wait_for_traces
from tracer.runner import Pipeline, Stage

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "big_task_heap_usage.py"
MOCK_STAGES = {"inflate": 4, "deflate": 4}


@pytest.fixture(scope="module", autouse=True)
def _ui_available() -> None:
    script()  # skips the module before any trace is written when there is no UI


#: The example run once per level, in one driver (as a script calling its main() once per
#: level would): one Ray start for both, not two. Each argument after the example is
#: LEVEL=TRACE, run in that order.
_RUN_AT_EACH_LEVEL = """
import runpy, sys
example, *runs = sys.argv[1:]
for run in runs:
    level, trace = run.split("=", 1)
    sys.argv = [example, "--num-partitions", "4", "--num-rows-per-partition", "20000",
                "--tracing-level", level, "--trace-out", trace]
    runpy.run_path(example, run_name="__main__")
"""


@pytest.fixture(scope="module")
def mock_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """examples/big_task_heap_usage.py, small, in a Ray of its own (as a user runs it), at
    level 2 (in a Ray just started, as a user's first run is) and then at level 1."""
    folder = tmp_path_factory.mktemp("mock")
    traces = {level: folder / f"mock-l{level}.perfetto-trace" for level in (2, 1)}
    # None of the tests' Ray settings (RAY_ADDRESS, RAY_TMPDIR, ...) but its task events
    # reported every 100 ms (conftest.py), which shortens the close's wait for the last ones.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RAY_") or k == "RAY_task_events_report_interval_ms"}
    env["RAY_AUTH_MODE"] = "disabled"
    env.pop("TRACER_ENABLE_RAY_TRACING", None)
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_AT_EACH_LEVEL, str(EXAMPLE),
         *(f"{level}={path}" for level, path in traces.items())],
        capture_output=True, text=True, timeout=240, env=env, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    written = [line.removeprefix("trace written to ") for line in proc.stdout.splitlines()
               if line.startswith("trace written to ")]
    assert written == [str(path) for path in traces.values()], proc.stdout[-2000:]
    return traces


@pytest.mark.parametrize("level", [1, 2])
def test_mock_workload(
    level: int, mock_traces: dict[int, Path], request: pytest.FixtureRequest
) -> None:
    """At level 2 the UI is opened as `tracer open` opens it: its startupCommands run after
    the load and must leave the dispatch loop pinned, the run, its scheduler, stages and
    nodes open and the rest closed (the tree the UI reports holds every track either way)."""
    trace = mock_traces[level]
    if level == 2:
        run = render(trace, out_dir(request), "--expand=none",
                     f"--ui=http://127.0.0.1:10000/#!/?{startup_query()}")
    else:
        run = render(trace, out_dir(request))
    model = read_trace(trace)
    root = check_runner_layout(run, model, MOCK_STAGES)
    (node,) = root.children[3:]
    # The node's requested and used memory: both there, first, on one y axis (the
    # trace's y_axis_share_key, which the UI scopes to the node).
    assert node.names[:2] == [L.COUNTER_NODE_MEMORY_REQUESTED, L.COUNTER_NODE_MEMORY_USED]
    keys = {t.y_axis_share_key for t in model.tracks.values()
            if t.name in (L.COUNTER_NODE_MEMORY_REQUESTED, L.COUNTER_NODE_MEMORY_USED)}
    assert keys == {L.NODE_MEMORY_AXIS}
    # Level 2 adds each worker's heap (memray) beside its RSS; level 1 has RSS only.
    for worker in node.children[2:]:
        counters = [c.name for c in worker.children if c.renderer == COUNTER]
        expected = [L.COUNTER_WORKER_RSS, L.COUNTER_WORKER_HEAP][:level]
        assert counters == expected, (worker.names, run.where())
    if level == 1:
        assert run.pinned == [] and all(n.expanded for n in root.walk() if n.children)
        return
    # `tracer open`'s view (a command that failed or was refused would show a dialog,
    # which check_runner_layout rules out).
    assert run.pinned == [L.DISPATCH_LOOP_THREAD], (run.pinned, run.where())
    assert root.expanded and not run.root("System").expanded, run.where()
    opened = {c.name.split(" (")[0].split(" ")[0]: c.expanded for c in root.children}
    assert opened == {L.SCHEDULER_PROCESS: True, "Ray": False, L.STAGES_TRACK: True,
                      L.NODE_PROCESS_PREFIX: True}, (opened, run.where())


def _inc(x: int) -> int:
    return x + 1


def _nap(folder: str, x: int) -> int:
    import time

    meet(folder, x)  # both nodes run one
    time.sleep(0.2)
    return x


def _raise_on_3(x: int) -> int:
    if x == 3:
        raise KeyError("always 3")
    return x * 10


def test_two_node_run(ray_cluster: object, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    trace = tmp_path / "two-nodes.perfetto-trace"
    folder = tmp_path / "started"
    folder.mkdir()
    stages = [Stage("nap", functools.partial(_nap, str(folder)), num_cpus=1),
              Stage("inc", _inc, num_cpus=1)]
    Pipeline(list(range(6)), stages).run(tracing_level=1, trace_path=trace, progress=False)
    assert wait_for_traces(trace, timeout=60)  # with Ray's events, drawn after the run returns
    run = render(trace, out_dir(request))
    root = check_runner_layout(run, read_trace(trace), {"nap": 6, "inc": 6})
    nodes = root.children[3:]
    assert [n.name.split(" (")[0] for n in nodes] == ["Node 0", "Node 1"], run.where()
    # Both nodes ran tasks (1 CPU each, tasks that wait): each shows its own workers, and
    # Ray's phases of their tasks under them (read from Ray for both nodes alike).
    assert all(any(c.count("slices") for c in n.children[2:]) for n in nodes), run.where()
    for node in nodes:
        workers = [c for c in node.children[2:] if c.count("slices")]
        assert all(L.RAY_PHASES_TRACK in w.names for w in workers), (node.name, run.where())


def test_run_with_failures(
    ray_local: None, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    trace = tmp_path / "failures.perfetto-trace"
    stages = [Stage("explode", _raise_on_3), Stage("after", abs)]
    with pytest.raises(KeyError, match="always 3"):
        Pipeline(list(range(5)), stages).run(tracing_level=1, trace_path=trace, progress=False)
    assert wait_for_traces(trace, timeout=60)  # with Ray's events, drawn after the run returns
    model = read_trace(trace)
    launched = {
        "explode": sum(1 for s in model.slices if s.category == L.CAT_TASK and s.depth == 0
                       and s.name == "explode"),
        "after": sum(1 for s in model.slices if s.category == L.CAT_TASK and s.depth == 0
                     and s.name == "after"),
    }
    run = render(trace, out_dir(request))
    root = check_runner_layout(run, model, launched)
    # The failure is marked on the worker where the task ran, beside its execution.
    marks = [w for n in root.children[3:] for w in n.children
             if w.slice_names.get(L.INSTANT_TASK_FAILED)]
    assert len(marks) == 1 and marks[0].slice_names["explode"] >= 1, run.where()

"""Every trace the test suite writes, checked by the real trace_processor.

A pytest plugin (loaded by ``tests/conftest.py``). trace_processor is the
engine behind the Perfetto UI, ``tracer query`` and the perfetto Python API:
what it makes of a trace is what users get. So after each test, every
``*.perfetto-trace`` file written during it (under pytest's temporary
folders, wherever a test, a session fixture or a subprocess put it, and in
the log folders of the Ray sessions the tests started) is loaded into
trace_processor, and the test fails (an error at its teardown) when:

* trace_processor's ``stats`` table has an entry of severity ``error`` or
  ``data_loss``, or one of the silent ones (``WATCHED_STATS``: what it drops
  or misreads with at most an "info");
* its slice, thread, process, counter or flow rows are not what
  :func:`tracer.format.read_trace` reads from the same file (processes and
  threads are compared as (pid, name) and (tid, name) sets, slices by
  (ts, dur, name) multiset, counters and flows by count);
* in a runner trace (one with execution slices), a flow does not run from a
  stage slice (in tracer's layout, the stage's ``task launched`` mark, an
  instant of category stage with the stage_id, nested in the stage's slice)
  to an execution of that stage, an execution has two incoming arrows, or a
  task of a stage with a slice got no arrow at all.

The binary is the one tracer itself would use (``$TRACE_PROCESSOR_PATH``,
the perfetto package's cache, ``trace_processor_shell`` on ``PATH``). It is
driven as a command (``trace_processor_shell query``: ~70 ms a trace) rather
than through the Python API (~1 s to start).

Without a binary, the check and the tests that need one
(:func:`trace_processor_bin`) skip, unless trace_processor is *required*:
``TRACER_REQUIRE_TRACE_PROCESSOR=1`` or ``TRACE_PROCESSOR_PATH`` set (a
binary was given): then they fail. CI sets both.

Tests that write broken traces on purpose opt out with
``@pytest.mark.unchecked_traces("why")`` (or a module's ``pytestmark``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tracer.format import TraceModel, read_trace
from tracer.query import TraceProcessorNotFoundError, find_trace_processor
from tracer.ray import layout as L

REQUIRE_VAR = "TRACER_REQUIRE_TRACE_PROCESSOR"

#: Stats trace_processor sets when it drops or misreads events, some with
#: only severity "info" or "notice": checking errors alone is not enough.
WATCHED_STATS = (
    "interned_data*", "track_event*", "misplaced*", "flow*", "clock_sync_failure*", "counter*",
)

#: Where the suite's traces are written: pytest's temporary folders, and the
#: log folders of the Ray sessions the tests started (the tracer's default
#: output), added by :func:`watch_folder`.
_WATCHED_FOLDERS: set[Path] = set()

_EXECUTION_MARKS = (L.INSTANT_TASK_FAILED, L.INSTANT_TASK_CANCELLED)


def required() -> bool:
    """Whether a missing trace_processor fails the run (CI) instead of skipping."""
    return os.environ.get(REQUIRE_VAR, "") not in ("", "0") or bool(
        os.environ.get("TRACE_PROCESSOR_PATH")
    )


def find_binary() -> str | None:
    """The trace_processor_shell tracer would use; None if there is none (an error if a
    given one is unusable)."""
    try:
        return find_trace_processor()
    except TraceProcessorNotFoundError:
        if os.environ.get("TRACE_PROCESSOR_PATH"):
            raise  # a binary was named and cannot be used: say why
        return None


def missing_binary(what: str) -> None:
    """Skip (or, when trace_processor is required, fail) for want of a binary."""
    message = (
        f"no trace_processor binary: {what} needs one (set TRACE_PROCESSOR_PATH to a "
        "trace_processor_shell, e.g. ../shared/bin/trace_processor_shell)"
    )
    if required():
        pytest.fail(f"{message}; {REQUIRE_VAR}=1 or TRACE_PROCESSOR_PATH makes this a failure")
    pytest.skip(message)


def watch_folder(folder: Path) -> None:
    """Also check the traces written under ``folder`` (e.g. a Ray session's logs)."""
    _WATCHED_FOLDERS.add(Path(folder))


# ------------------------------------------------------------------ the check

_QUERY = """
SELECT json_object(
  'stats', (SELECT json_group_array(json_array(name, idx, severity, value)) FROM stats
            WHERE value > 0 AND (severity IN ('error', 'data_loss') OR {watched})),
  'processes', (SELECT json_group_array(json_array(pid, name)) FROM process WHERE upid != 0),
  'threads', (SELECT json_group_array(json_array(tid, name)) FROM thread WHERE utid != 0),
  'slices', (SELECT json_group_array(json_array(ts, dur, name)) FROM slice),
  'counters', (SELECT COUNT(*) FROM counter),
  'flows', (SELECT COUNT(*) FROM flow),
  'dangling_flows', (SELECT COUNT(*) FROM flow f LEFT JOIN slice so ON so.id = f.slice_out
                     LEFT JOIN slice si ON si.id = f.slice_in
                     WHERE so.id IS NULL OR si.id IS NULL),
  'arrows', (SELECT json_group_array(json_array(
                so.category, EXTRACT_ARG(so.arg_set_id, 'debug.stage_id'),
                si.category, si.id, EXTRACT_ARG(si.arg_set_id, 'debug.task_id')))
             FROM flow f JOIN slice so ON so.id = f.slice_out JOIN slice si ON si.id = f.slice_in),
  'stages', (SELECT json_group_array(DISTINCT EXTRACT_ARG(arg_set_id, 'debug.stage_id'))
             FROM slice WHERE category = 'stage'),
  'tasks', (SELECT json_group_array(json_array(EXTRACT_ARG(arg_set_id, 'debug.task_id'),
                                               EXTRACT_ARG(arg_set_id, 'debug.stage_id')))
            FROM slice WHERE category = 'task' AND depth = 0),
  'executions', (SELECT json_group_array(json_array(id, EXTRACT_ARG(arg_set_id, 'debug.task_id')))
                 FROM slice WHERE category = 'execution' AND name NOT IN ({marks}))
) AS j
"""


def _query() -> str:
    watched = " OR ".join(f"name GLOB '{pattern}'" for pattern in WATCHED_STATS)
    marks = ", ".join(f"'{name}'" for name in _EXECUTION_MARKS)
    return _QUERY.format(watched=watched, marks=marks)


def inspect(path: Path, bin_path: str) -> dict[str, Any]:
    """What trace_processor makes of ``path`` (one run of the shell)."""
    proc = subprocess.run(
        [bin_path, "query", str(path), _query()],
        capture_output=True, text=True, timeout=300, check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or len(lines) != 2:
        raise AssertionError(
            f"trace_processor failed on {path} (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-2000:]}"
        )
    # The CSV cell is the JSON text between quotes (the shell does not escape them).
    result: dict[str, Any] = json.loads(lines[1][1:-1])
    return result


def problems(path: Path, bin_path: str, model: TraceModel | None = None) -> list[str]:
    """Everything trace_processor says is wrong with ``path``, or disagrees with our reader."""
    tp = inspect(path, bin_path)
    found: list[str] = []
    if model is None:
        try:
            model = read_trace(path)
        except Exception as exc:
            return [f"tracer's reader refuses it: {exc}"]
    for name, idx, severity, value in tp["stats"]:
        where = "" if idx is None else f"[{idx}]"
        found.append(f"stat {name}{where} = {value} ({severity})")

    ours_processes = {(t.pid, t.name) for t in model.tracks.values() if t.kind == "process"}
    pids = {pid for pid, _ in ours_processes}
    ours_processes |= {
        (t.pid, None) for t in model.tracks.values() if t.kind == "thread" and t.pid not in pids
    }
    theirs_processes = {(pid, name) for pid, name in tp["processes"]}
    if theirs_processes != ours_processes:
        found.append(f"processes: trace_processor {sorted(theirs_processes, key=str)}, "
                     f"reader {sorted(ours_processes, key=str)}")

    ours_threads = {(t.tid, t.name) for t in model.tracks.values() if t.kind == "thread"}
    tids = {tid for tid, _ in ours_threads}
    # trace_processor gives each process a main thread (tid = pid).
    ours_threads |= {(pid, None) for pid, _ in ours_processes if pid not in tids}
    theirs_threads = {(tid, name) for tid, name in tp["threads"]}
    if theirs_threads != ours_threads:
        found.append(f"threads: trace_processor {sorted(theirs_threads, key=str)}, "
                     f"reader {sorted(ours_threads, key=str)}")

    ours_slices = Counter((s.ts, -1 if s.dur is None else s.dur, s.name) for s in model.slices)
    ours_slices.update((i.ts, 0, i.name) for i in model.instants)
    theirs_slices = Counter((ts, dur, name) for ts, dur, name in tp["slices"])
    if theirs_slices != ours_slices:
        missing = list((ours_slices - theirs_slices).elements())[:5]
        extra = list((theirs_slices - ours_slices).elements())[:5]
        found.append(
            f"slices: trace_processor {sum(theirs_slices.values())}, reader "
            f"{sum(ours_slices.values())} (missing in trace_processor e.g. {missing}; "
            f"extra e.g. {extra})"
        )
    if tp["counters"] != len(model.counters):
        found.append(f"counters: trace_processor {tp['counters']}, reader {len(model.counters)}")
    if tp["flows"] != len(model.flows):
        found.append(f"flows: trace_processor {tp['flows']}, reader {len(model.flows)}")
    if tp["dangling_flows"]:
        found.append(f"{tp['dangling_flows']} flows do not join two slices of the trace")
    if tp["executions"]:
        found.extend(_arrow_problems(tp))
    return found


def _arrow_problems(tp: dict[str, Any]) -> list[str]:
    """A runner trace's flows: each from a stage slice to an execution of that stage, one
    per task (its first measured attempt), none missing where the stage has a slice."""
    found: list[str] = []
    stage_of = {str(task): stage for task, stage in tp["tasks"]}
    into: Counter[int] = Counter()
    arrows_per_task: Counter[str] = Counter()
    for out_cat, out_stage, in_cat, in_id, in_task in tp["arrows"]:
        if out_cat != L.CAT_STAGE or in_cat != L.CAT_EXECUTION:
            found.append(f"a flow from a {out_cat} slice to a {in_cat} slice (task {in_task})")
            continue
        if stage_of.get(str(in_task)) != out_stage:
            found.append(f"an arrow of stage {out_stage} to task {in_task} of stage "
                         f"{stage_of.get(str(in_task))}")
        into[in_id] += 1
        arrows_per_task[str(in_task)] += 1
    doubled = [i for i, n in into.items() if n > 1]
    if doubled:
        found.append(f"{len(doubled)} executions with more than one incoming arrow")
    written = set(tp["stages"])
    attempts = Counter(str(task) for task, _ in tp["tasks"])
    executed = {str(task) for _, task in tp["executions"]}
    orphans = sorted(t for t in executed if stage_of.get(t) in written and not arrows_per_task[t])
    if orphans:
        found.append(f"executions of {len(orphans)} tasks with no arrow from their stage, "
                     f"e.g. {orphans[:5]}")
    over = sorted(t for t, n in arrows_per_task.items() if n > attempts[t])
    if over:
        found.append(f"tasks with more arrows than task slices: {over[:5]}")
    return found


# ------------------------------------------------------------ pytest plugin


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "unchecked_traces(reason): the test writes broken traces on purpose; "
        "trace_processor does not check them",
    )


def _traces_since(folders: list[Path], since_ns: int) -> Iterator[Path]:
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in folder.rglob("*.perfetto-trace"):
            try:
                if path.is_file() and path.stat().st_mtime_ns >= since_ns:
                    yield path
            except OSError:
                continue  # removed meanwhile (a test's own cleanup)


@pytest.fixture(scope="session")
def _trace_check_state(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return {"base": tmp_path_factory.getbasetemp(), "checked": {}, "bin": None, "looked": False}


def _wait_if_finishing() -> None:
    """Runs of the test whose traces are still being finished (tracer.ray.finishing)."""
    finishing = sys.modules.get("tracer.ray.finishing")
    if finishing is not None:
        finishing.wait_for_traces()


@pytest.fixture(autouse=True)
def _check_written_traces(
    request: pytest.FixtureRequest, _trace_check_state: dict[str, Any]
) -> Iterator[None]:
    """After each test: trace_processor checks every trace written during it."""
    # File times are the kernel's coarse clock (a few ms behind time_ns): look back 1 s.
    start = time.time_ns() - 1_000_000_000
    yield
    _wait_if_finishing()
    state = _trace_check_state
    folders = [state["base"], *sorted(_WATCHED_FOLDERS)]
    fresh = []
    for path in _traces_since(folders, start):
        stat = path.stat()
        key = (stat.st_mtime_ns, stat.st_size)
        if state["checked"].get(path) != key:
            fresh.append((path, key))
    if request.node.get_closest_marker("unchecked_traces") is not None:
        state["checked"].update(fresh)  # not in the next test either
        return
    if not fresh:
        return
    if not state["looked"]:
        state["bin"], state["looked"] = find_binary(), True
    if state["bin"] is None:
        if required():
            pytest.fail(f"no trace_processor binary to check {len(fresh)} traces "
                        f"({REQUIRE_VAR} is set)")
        return
    failures = []
    for path, key in fresh:
        state["checked"][path] = key  # once, even if it fails: not again in the next test
        found = problems(path, state["bin"])
        if found:
            failures.append(f"{path}:\n  " + "\n  ".join(found))
    if failures:
        pytest.fail("trace_processor does not read these traces as written:\n"
                    + "\n".join(failures), pytrace=False)


@pytest.fixture(scope="session")
def trace_processor_bin() -> str:
    """The trace_processor_shell binary; skips without one (fails when it is required)."""
    path = find_binary()
    if path is None:
        missing_binary("this test")
    assert path is not None
    return path

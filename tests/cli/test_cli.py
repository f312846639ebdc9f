"""``python -m tracer summary | memory | query``: outputs and errors, as a user runs them."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cli_workloads
import pytest
from trace_bytes import cut_inside_a_record, uncompressed

from tracer.query import QueryConfig, TraceQuery, records

ROOT = Path(__file__).resolve().parents[2]


def tracer(*args: str | Path, env: dict[str, str] | None = None,
           stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tracer", *map(str, args)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, input=stdin,
        env={**os.environ, **(env or {})},
    )


def no_binary_env(tmp_path: Path) -> dict[str, str]:
    """No trace_processor anywhere tracer looks (python itself is run by absolute path)."""
    return {"TRACE_PROCESSOR_PATH": "", "HOME": str(tmp_path), "PATH": str(tmp_path)}


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tracer: error: "), lines[0]
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def trace(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cli_workloads.run(tmp_path_factory.mktemp("cli") / "run.perfetto-trace")


@pytest.fixture(scope="module")
def truncated(trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = uncompressed(trace.read_bytes())
    path = tmp_path_factory.mktemp("cli") / "cut.perfetto-trace"
    path.write_bytes(cut_inside_a_record(data, 0.5))
    return path


# ------------------------------------------------------------------- summary


def test_summary_as_plain_text(trace: Path) -> None:
    result = tracer("summary", trace, "--engine", "reader")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    assert "\033[" not in out  # piped: no colours
    assert out.isascii()  # piped: no box drawing, no µ
    for title in ("Stages", "Task latency by stage", "Dispatch loop", "Workers"):
        assert title in out
    for stage in ("nap", "grow"):
        assert f"  {stage}  " in out
    for phase in ("plan polling", "batching", "dispatching", "awaiting", "gaps in waves"):
        assert phase in out
    assert "level 1" in out and "engine reader" in out
    assert "Ray's events read from gcs: none missing" in out  # the header's second line
    assert "The driver's Python GC: " in out  # under the dispatch loop's table
    stages = out.split("Stages\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert stages[0].split()[:3] == ["id", "stage", "tasks"]
    assert set(stages[1]) <= {"-", " "}
    assert stages[2].split()[:3] == ["0", "nap", str(cli_workloads.PARTITIONS)]
    # 'nap' asks for 1 MiB, below any worker's own memory: at level 1 it looks exceeded,
    # and the summary says why, under the table.
    assert stages[2].split()[-1] == str(cli_workloads.PARTITIONS)
    assert ("Level 1's peaks are the worker's private RSS, its own ~60-120 MiB included: "
            "requests below that always look exceeded") in out
    # The workers' table: Ray's handling of their tasks beside the executions (the run has
    # Ray's events), never below them.
    workers = out.split("\nWorkers: ", 1)[1].split("\n\n", 1)[0].splitlines()
    assert workers[0].startswith("busy share of the run (with Ray: counting Ray's handling"), \
        workers[0]
    assert workers[0].endswith(" bucket (timeline: ' .:-=+*#' from idle to busy)"), workers[0]
    assert workers[1].split() == ["node", "worker", "busy", "with", "Ray", "timeline"]
    for row in workers[3:]:
        busy, with_ray = (float(v[:-1]) for v in row.split() if v.endswith("%"))
        assert with_ray >= busy, row


def test_summary_as_json_matches_the_api(trace: Path) -> None:
    result = tracer("summary", trace, "--json", "--buckets", "5", "--engine", "reader")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    q = TraceQuery(trace, QueryConfig(engine="reader"))
    assert data["engine"] == "reader"
    assert data["run"]["tracing_level"] == 1
    assert data["stages"] == records(q.stage_summary())
    assert data["latency_by_stage"] == records(q.latency_by_stage())
    assert data["dispatch_loop"] == records(q.dispatch_loop())
    assert data["worker_utilisation"] == records(q.worker_utilisation(5))
    assert [s["stage"] for s in data["stages"]] == ["nap", "grow"]
    assert all(s["tasks"] == cli_workloads.PARTITIONS for s in data["stages"])


def test_a_folder_of_traces_reads_its_newest(trace: Path, tmp_path: Path) -> None:
    """The folder a process writes its traces to (<session>/logs/tracer) is what a user
    knows: summary, memory and query read its newest trace and say which."""
    import shutil

    older = tmp_path / "runner.a.20260101T000000.perfetto-trace"
    newest = tmp_path / "runner.b.20260101T000001.perfetto-trace"
    (tmp_path / "notes.txt").write_text("not a trace\n")
    older.write_bytes(b"\x0a\x00")  # an empty packet: a trace of nothing
    shutil.copyfile(trace, newest)
    os.utime(older, ns=(1, 1))
    for command, extra in (("summary", ["--engine", "reader"]), ("memory", ["--engine", "reader"]),
                           ("query", ["SELECT COUNT(*) AS n FROM tracer_task"])):
        result = tracer(command, tmp_path, *extra)
        assert result.returncode == 0, result.stderr
        assert result.stderr.splitlines()[0] == (
            f"tracer: {tmp_path} is a folder: reading its newest trace, {newest.name} "
            "(of 2 there)"), result.stderr
        assert str(newest) in result.stdout or command == "query", result.stdout
    assert "nap" in tracer("summary", tmp_path, "--engine", "reader").stdout
    # The library takes the folder too (it raised 'not a file'), and says which it read.
    with TraceQuery(tmp_path, QueryConfig(engine="reader")) as q:
        assert q.path == newest and "nap" in list(q.stage_summary()["stage"])


def test_summary_of_a_truncated_trace_warns_and_answers(truncated: Path) -> None:
    result = tracer("summary", truncated, "--engine", "reader")
    assert result.returncode == 0, result.stderr
    assert "tracer: warning: the trace is truncated" in result.stderr
    assert "Traceback" not in result.stderr
    assert "Stages" in result.stdout


def test_summary_of_a_trace_cut_inside_its_only_bundle(trace: Path, tmp_path: Path) -> None:
    data = trace.read_bytes()  # compressed: one bundle, lost whole when cut
    cut = tmp_path / "cut.perfetto-trace"
    cut.write_bytes(data[: len(data) // 2])
    # Nothing to analyse is an error (it printed empty tables with status 0, which a
    # script reads as a run that did nothing: a fresh user's review).
    assert_one_line_error(tracer("summary", cut, "--engine", "reader"),
                          "is cut before its first complete packet")


@pytest.mark.parametrize("engine", ["reader", "trace_processor"])
def test_a_cut_trace_is_never_an_all_clear(
    engine: str, trace: Path, truncated: Path, tmp_path: Path, trace_processor_bin: str
) -> None:
    """trace_processor reads a trace cut inside its only bundle as an empty trace, without a
    word: `memory` would say every task stayed within its request. Every command says it,
    as an error: there is nothing to analyse."""
    data = trace.read_bytes()  # compressed: one bundle, lost whole when cut
    cut = tmp_path / "cut.perfetto-trace"
    cut.write_bytes(data[: len(data) // 2])
    env = {"TRACE_PROCESSOR_PATH": trace_processor_bin}
    for command in ("summary", "memory"):
        assert_one_line_error(tracer(command, cut, "--engine", engine, env=env),
                              "is cut before its first complete packet")
    assert_one_line_error(tracer("query", cut, "SELECT COUNT(*) AS n FROM slice", env=env),
                          "is cut before its first complete packet")
    cut_later = tracer("summary", truncated, "--engine", engine, env=env)  # raw packets, cut
    assert cut_later.returncode == 0, cut_later.stderr
    assert "tracer: warning: the trace is truncated" in cut_later.stderr
    assert "Stages" in cut_later.stdout


def test_a_gzipped_trace_reads_in_both_engines(
    trace: Path, tmp_path: Path, trace_processor_bin: str
) -> None:
    import gzip

    packed = tmp_path / "run.perfetto-trace.gz"
    packed.write_bytes(gzip.compress(trace.read_bytes()))
    env = {"TRACE_PROCESSOR_PATH": trace_processor_bin}
    answers = []
    for path, engine in ((trace, "reader"), (packed, "reader"), (packed, "trace_processor")):
        result = tracer("summary", path, "--engine", engine, "--json", env=env)
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        data = json.loads(result.stdout)
        answers.append((data["run"], data["stages"]))
    assert answers[0] == answers[1] == answers[2]
    cut = tmp_path / "cut.perfetto-trace.gz"  # a copy cut short: a truncated trace
    cut.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    # Nothing in it: an error, in every engine and command (empty tables and status 0
    # read, to a script, as a run that did nothing).
    for command, engine in (("summary", "reader"), ("summary", "auto"),
                            ("summary", "trace_processor"), ("memory", "reader")):
        assert_one_line_error(
            tracer(command, cut, "--engine", engine, env=env),
            "is cut before its first complete packet: there is nothing in it to analyse",
        )


def test_summary_of_a_trace_that_is_not_a_runners(tmp_path: Path) -> None:
    from tracer.format import TraceWriter

    path = tmp_path / "plain.perfetto-trace"
    with TraceWriter(path) as w:
        track = w.track("something")
        w.begin(track, "work")
        w.end(track)
    result = tracer("summary", path)
    assert result.returncode == 0, result.stderr
    assert "was it written by tracer.ray?" in result.stderr
    # A converted Ray timeline is such a trace: what to do with it instead.
    assert "`tracer convert` has Ray's tasks and phases only: `tracer open`" in result.stderr
    memory = tracer("memory", path)  # no tasks is not "every task stayed within its request"
    assert memory.returncode == 0, memory.stderr
    assert "was it written by tracer.ray?" in memory.stderr


def test_summary_with_trace_processor_but_no_binary(trace: Path, tmp_path: Path) -> None:
    result = tracer("summary", trace, "--engine", "trace_processor", env=no_binary_env(tmp_path))
    assert_one_line_error(result, "TRACE_PROCESSOR_PATH", "--engine reader")
    auto = tracer("summary", trace, "--engine", "auto", "--json", env=no_binary_env(tmp_path))
    assert auto.returncode == 0, auto.stderr
    assert json.loads(auto.stdout)["engine"] == "reader"
    default = tracer("summary", trace, "--json", env=no_binary_env(tmp_path))  # auto
    assert json.loads(default.stdout) == json.loads(auto.stdout)


def test_summary_auto_warns_about_a_broken_trace_processor_path(
    trace: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "notexec"
    env = {**no_binary_env(tmp_path), "TRACE_PROCESSOR_PATH": str(missing)}
    auto = tracer("summary", trace, "--engine", "auto", "--json", env=env)
    assert auto.returncode == 0, auto.stderr
    assert json.loads(auto.stdout)["engine"] == "reader"
    (line,) = auto.stderr.splitlines()
    assert line.startswith(f"tracer: warning: TRACE_PROCESSOR_PATH={missing}: no such file"), line
    assert line.endswith("used tracer's reader instead"), line


# -------------------------------------------------------------------- memory


def test_memory_as_plain_text(trace: Path) -> None:
    result = tracer("memory", trace)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Requested vs actual, by stage" in out
    assert "By node" in out
    n = cli_workloads.PARTITIONS
    # Level 1 measures the worker's RSS: every 1 MiB nap task is over, no 1 GiB grow task.
    assert f"Tasks over their memory request, or killed for memory: {n}" in out
    assert "1.0 MiB" in out and "1.0 GiB" in out
    assert out.count("over request  ") >= 1


def test_memory_as_json(trace: Path) -> None:
    result = tracer("memory", trace, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert {r["stage"] for r in data["flagged"]} == {"nap"}
    assert len(data["flagged"]) == cli_workloads.PARTITIONS
    assert [r["over_request"] for r in data["by_stage"]] == [cli_workloads.PARTITIONS, 0]
    assert data["by_node"][0]["tasks"] == 2 * cli_workloads.PARTITIONS


def _runner_like_trace(path: Path, peak: object, stage: str = "grow") -> Path:
    """One task of a runner-shaped trace whose execution reports ``peak`` as its memory peak."""
    from tracer.format import TraceWriter
    from tracer.ray import layout as L

    with TraceWriter(path) as w:
        root = w.track(f"{L.RUN_TRACK_PREFIX} x")
        loop = w.track(L.DISPATCH_LOOP_THREAD, parent=w.track(L.SCHEDULER_PROCESS, parent=root))
        lane = w.track(L.TASK_LANE, parent=w.track(L.TASKS_TRACK, parent=root))
        worker = w.track("worker 3", parent=w.track("Node 0 (abc)", parent=root))
        t0 = w.now()
        w.begin(loop, L.SLICE_EXECUTION, t0, category=L.CAT_SCHEDULER,
                args={"execution_id": "x", "runner": "r", "tracing_level": 2})
        w.begin(lane, stage, t0 + 10, category=L.CAT_TASK,
                args={L.ARG_TASK_ID: "0-0", L.ARG_STAGE_ID: 0,
                      L.ARG_RESOURCE_REQUEST: {"memory_bytes": 1000}})
        w.begin(lane, L.SLICE_DISPATCHED, t0 + 20, category=L.CAT_TASK)
        w.begin(worker, stage, t0 + 30, category=L.CAT_EXECUTION, args={L.ARG_TASK_ID: "0-0"})
        w.end(worker, t0 + 40, args={L.ARG_MEMORY_REQUESTED: 1000, L.ARG_MEMORY_PEAK: peak,
                                     L.ARG_HEAP_PEAK: peak})
        w.end(lane, t0 + 50)
        w.end(lane, t0 + 60)
        w.end(loop, t0 + 70)
    return path


def test_summary_says_the_run_ended_with_an_error_and_what_was_left_in_flight(
    tmp_path: Path,
) -> None:
    """A loop that raised (or a driver that exited with its tracer open) ends the run's
    slice with the error, and its tasks in flight end unfinished: the summary says both
    (it said '0 failed' and nothing more); run_info has the error, in both engines."""
    from tracer.format import TraceWriter
    from tracer.ray import ResourceRequest
    from tracer.ray import layout as L
    from tracer.ray.timeline import RunTimeline, TimelineTask

    path = tmp_path / "raised.perfetto-trace"
    t0 = 1_800_000_000_000_000_000
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="x", runner_name="mine", loop_pid=5, loop_tid=5)
        done, left = (tl.task_created(TimelineTask, t, 0, ResourceRequest(num_cpus=1),
                                      t0, stage_name="map") for t in ("0-0", "0-1"))
        for task in (done, left):
            tl.task_dispatched(task, t0 + 10)
        tl.task_ended(done, t0 + 50, None)
        tl.task_ended(left, t0 + 60, {L.ARG_STATUS: L.STATUS_UNFINISHED})
        tl.close({L.ARG_ERROR_TYPE: "KeyError", L.ARG_ERROR: "'partition 7'\n(in the loop)"})
    for engine in ("reader", "trace_processor"):
        out = tracer("summary", path, "--engine", engine)
        assert out.returncode == 0, out.stderr
        assert ("The run ended with an error: KeyError: 'partition 7' (in the loop)"
                in out.stdout), out.stdout
        assert "Unfinished (in flight when the trace ended): 1 of 'map'" in out.stdout
        with TraceQuery(path, QueryConfig(engine=engine)) as q:  # type: ignore[arg-type]
            assert q.run_info()["error_type"] == "KeyError"
    clean = _runner_like_trace(tmp_path / "clean.perfetto-trace", 500)
    out = tracer("summary", clean, "--engine", "reader").stdout
    assert "ended with an error" not in out and "Unfinished" not in out
    # An error whose text starts with its type (Ray Data's) names the type once.
    typed = tmp_path / "typed.perfetto-trace"
    with TraceWriter(typed) as w:
        RunTimeline(w, execution_id="y", runner_name="ray-data", loop_pid=5, loop_tid=5).close(
            {L.ARG_ERROR_TYPE: "ValueError", L.ARG_ERROR: "ValueError: boom on block 200"})
    out = tracer("summary", typed, "--engine", "reader").stdout
    assert "The run ended with an error: ValueError: boom on block 200\n" in out, out


def _gc_trace(path: Path, gc_args: dict[str, int] | None) -> Path:
    """A run's loop of 100 ms whose execution slice ends with ``gc_args`` (None: a trace
    written before the driver's GC was recorded)."""
    from tracer.format import TraceWriter
    from tracer.ray import layout as L

    with TraceWriter(path) as w:
        root = w.track(f"{L.RUN_TRACK_PREFIX} x")
        loop = w.track(L.DISPATCH_LOOP_THREAD, parent=w.track(L.SCHEDULER_PROCESS, parent=root))
        t0 = w.now()
        w.begin(loop, L.SLICE_EXECUTION, t0, category=L.CAT_SCHEDULER,
                args={"execution_id": "x", "runner": "r", "tracing_level": 1})
        w.begin(loop, L.SLICE_WAVE, t0, category=L.CAT_SCHEDULER)
        w.end(loop, t0 + 100_000_000)
        w.end(loop, t0 + 100_000_000, args=gc_args)
    return path


@pytest.mark.parametrize("engine", ["reader", "trace_processor"])
def test_summary_says_what_the_drivers_gc_took(
    engine: str, tmp_path: Path, trace_processor_bin: str
) -> None:
    """Its share of the loop's time, and what to do once it is 5% or more."""
    from tracer.ray import layout as L

    def summary(gc_ns: int | None) -> str:
        args = None if gc_ns is None else {
            L.ARG_DRIVER_GC_COLLECTIONS: 7, L.ARG_DRIVER_GC_NS: gc_ns,
            L.ARG_DRIVER_GC_LONGEST_NS: gc_ns // 2}
        path = _gc_trace(tmp_path / f"gc-{gc_ns}.perfetto-trace", args)
        result = tracer("summary", path, "--engine", engine,
                        env={"TRACE_PROCESSOR_PATH": trace_processor_bin})
        assert result.returncode == 0, result.stderr
        return result.stdout

    heavy = summary(20_000_000)
    assert ("The driver's Python GC: 7 collections, 20.0 ms in all (20.0% of the loop's "
            "time), the longest 10.0 ms") in heavy
    assert "gc.freeze()" in heavy
    light = summary(2_000_000)
    assert "7 collections, 2.00 ms in all (2.0% of the loop's time)" in light
    assert "gc.freeze()" not in light
    assert "Python GC" not in summary(None)  # an older trace: nothing said


@pytest.mark.parametrize("peak", [float("inf"), float("nan"), "lots", 2**70, True])
def test_memory_values_that_are_not_byte_amounts_count_as_unmeasured(
    peak: object, tmp_path: Path
) -> None:
    """A trace written elsewhere may hold anything in a memory arg: no traceback, no row."""
    path = _runner_like_trace(tmp_path / "odd.perfetto-trace", peak)
    for command in ("memory", "summary"):
        result = tracer(command, path, "--engine", "reader")
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
    memory = tracer("memory", path, "--json", "--engine", "reader")
    assert json.loads(memory.stdout)["flagged"] == []
    assert "(no measured or killed tasks)" in tracer("memory", path, "--engine", "reader").stdout


def test_a_float_memory_peak_is_a_byte_amount(tmp_path: Path) -> None:
    path = _runner_like_trace(tmp_path / "float.perfetto-trace", 1.5e9)
    result = tracer("memory", path, "--json", "--engine", "reader")
    assert result.returncode == 0, result.stderr
    (flagged,) = json.loads(result.stdout)["flagged"]
    assert flagged["peak_bytes"] == 1_500_000_000


@pytest.mark.parametrize(
    ("stage", "shown"),
    [
        # 48 characters, cut in the middle: names end in what tells them apart.
        ("scan " + "x" * 300 + " end", "scan " + "x" * 13 + "..." + "x" * 23 + " end"),
        ("ReadFilesParquetV2->MapBatches(fast_one)->MapBatches(slow_udf)",
         "ReadFilesParquetV2..._one)->MapBatches(slow_udf)"),
        ("line one\nline two\tand\rmore", "line one\\nline two\\tand\\rmore"),
    ],
)
def test_a_long_or_multiline_stage_name_keeps_the_tables_rows_whole(
    stage: str, shown: str, tmp_path: Path
) -> None:
    """A stage named by a query plan (long, multi-line) shows cut to one line of its table,
    escaped: the other columns stay under their headers. The JSON output has it whole."""
    path = _runner_like_trace(tmp_path / "named.perfetto-trace", 5000, stage)
    for command in ("summary", "memory"):
        result = tracer(command, path, "--engine", "reader")
        assert result.returncode == 0, result.stderr
        rows = [line for line in result.stdout.splitlines() if shown in line]
        assert rows, result.stdout
        assert stage not in result.stdout
        for row in rows:
            assert len(row) < 160, row
    memory = json.loads(tracer("memory", path, "--json", "--engine", "reader").stdout)
    assert memory["flagged"][0]["stage"] == stage


@pytest.mark.parametrize(("source", "missing", "dropped", "said"), [
    ("gcs", 0, 0, "Ray's events read from gcs: none missing"),
    ("gcs", 3, 0, "Ray's events read from gcs: 3 executions without them"),
    # No read made: nothing wanted them (a run with no executions), or none could be.
    ("none", 0, 0, "Ray's events not read: no execution needed them"),
    ("none", 2, 0, "Ray's events not read: 2 executions without them"),
    # What Ray dropped is said only as a reason for what is missing: its count includes
    # the driver's own submit_task events past 1000 (a run of 10,000 tasks: 9000).
    ("gcs", 0, 9000, "Ray's events read from gcs: none missing"),
    ("gcs", 4, 9000, "Ray's events read from gcs: 4 executions without them (9000 events "
     "dropped by Ray's caps)"),
])
def test_the_summary_says_whether_rays_events_were_read(
    source: str, missing: int, dropped: int, said: str, tmp_path: Path
) -> None:
    from tracer.format import TraceWriter
    from tracer.ray import layout as L

    path = tmp_path / "events.perfetto-trace"
    with TraceWriter(path) as w:
        loop = w.track(L.DISPATCH_LOOP_THREAD, parent=w.track(
            L.SCHEDULER_PROCESS, parent=w.track(f"{L.RUN_TRACK_PREFIX} x")))
        t0 = w.now()
        w.begin(loop, L.SLICE_EXECUTION, t0, category=L.CAT_SCHEDULER,
                args={"execution_id": "x", "runner": "r", "tracing_level": 1})
        w.instant(loop, L.INSTANT_RAY_EVENTS, t0 + 5, category=L.CAT_SCHEDULER,
                  args={L.ARG_RAY_EVENTS_SOURCE: source, L.ARG_RAY_EVENTS_MISSING: missing,
                        L.ARG_RAY_EVENTS_DROPPED: dropped})
        w.end(loop, t0 + 10)
    result = tracer("summary", path, "--engine", "reader")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == said


def test_memory_limit(trace: Path) -> None:
    result = tracer("memory", trace, "--limit", "1")
    assert result.returncode == 0, result.stderr
    assert "(the worst 1; --limit 0 lists all)" in result.stdout


def test_a_negative_memory_limit_is_a_usage_error(trace: Path) -> None:
    from tracer.cli.memory import memory_report

    result = tracer("memory", trace, "--limit", "-1")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == (
        "tracer memory: error: argument --limit: must be at least 0, got -1"
    )
    with pytest.raises(ValueError, match="limit must be >= 0"):
        memory_report(trace, limit=-1)


# --------------------------------------------------------------------- query


def test_query_without_a_binary_says_what_to_do(trace: Path, tmp_path: Path) -> None:
    result = tracer("query", trace, "SELECT 1", env=no_binary_env(tmp_path))
    assert_one_line_error(result, "TRACE_PROCESSOR_PATH", "https://")


@pytest.fixture(scope="module")
def tp_bin(trace_processor_bin: str) -> str:
    return trace_processor_bin


def test_query_formats(trace: Path, tp_bin: str) -> None:
    sql = "SELECT stage, COUNT(*) AS n FROM tracer_task GROUP BY stage ORDER BY stage"
    env = {"TRACE_PROCESSOR_PATH": tp_bin}
    n = cli_workloads.PARTITIONS
    table = tracer("query", trace, sql, env=env)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split() == ["stage", "n"]
    assert [line.split() for line in table.stdout.splitlines()[2:]] == [
        ["grow", str(n)], ["nap", str(n)]]
    csv = tracer("query", trace, sql, "--csv", env=env)
    assert csv.stdout.splitlines() == ["stage,n", f"grow,{n}", f"nap,{n}"]
    js = tracer("query", trace, "-", "--json", env=env, stdin=sql)
    assert json.loads(js.stdout) == [{"stage": "grow", "n": n}, {"stage": "nap", "n": n}]
    bad = tracer("query", trace, "SELECT * FROM no_such_table", env=env)
    assert_one_line_error(bad, "query failed", "no_such_table")


def test_query_keeps_columns_that_share_a_name(trace: Path, tp_bin: str) -> None:
    """SQL lets two result columns share a name (a join's two `name`s): no output drops
    one; blobs and infinities, which JSON has no value for, are written, not a traceback."""
    sql = ("SELECT 'a' AS name, 'b' AS name, x'00ff' AS blob, 1e308 * 10 AS big, "
           "-1e308 * 10 AS small")
    env = {"TRACE_PROCESSOR_PATH": tp_bin}
    table = tracer("query", trace, sql, env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["name", "name", "blob", "big", "small"]
    assert lines[2].split() == ["a", "b", "00ff", "inf", "-inf"]
    csv = tracer("query", trace, sql, "--csv", env=env)
    assert csv.stdout.splitlines() == ["name,name,blob,big,small", "a,b,00ff,inf,-inf"]
    js = tracer("query", trace, sql, "--json", env=env)
    assert js.returncode == 0, js.stderr
    assert json.loads(js.stdout) == [
        {"name": "a", "name.1": "b", "blob": "00ff", "big": "inf", "small": "-inf"}]
    joined = tracer(  # the case users meet: a slice's name and its track's
        "query", trace,
        "SELECT s.name, t.name FROM slice s JOIN track t ON t.id = s.track_id "
        "WHERE s.category = 'execution' LIMIT 1", "--json", env=env,
    )
    (row,) = json.loads(joined.stdout)
    assert row["name"] in ("nap", "grow") and row["name.1"].startswith("worker ")


def test_records_keep_every_column() -> None:
    import pandas as pd

    from tracer.query import unique_names

    assert unique_names(["name", "name.1", "name", "x", "name"]) == [
        "name", "name.1", "name.2", "x", "name.3"]
    frame = pd.DataFrame([[1, 2, 3]], columns=["a", "a", "b"])
    assert records(frame) == [{"a": 1, "a.1": 2, "b": 3}]


_LONG_SQL = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000000000) "
    "SELECT COUNT(*) FROM c"
)


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        kids.extend(int(k) for k in text)
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_sigterm_stops_the_trace_processor_it_started(trace: Path, tp_bin: str) -> None:
    """`timeout`, `kill` or a cancelled CI job send SIGTERM: the command unwinds as for
    Ctrl-C, and the trace_processor it started does not run on alone (a query can hold
    gigabytes)."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "tracer", "query", str(trace), _LONG_SQL],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "TRACE_PROCESSOR_PATH": tp_bin},
    )
    shells: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not shells and time.monotonic() < deadline:
            shells = [k for k in _children(proc.pid)
                      if "trace_processor" in Path(f"/proc/{k}/cmdline").read_text()]
            time.sleep(0.1)
        assert shells, "trace_processor did not start"
        time.sleep(1.0)  # the query is running
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 20
        while any(_alive(k) for k in shells) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(k) for k in shells), "trace_processor outlived tracer"
        _, err = proc.communicate(timeout=10)
        assert "Traceback" not in err
    finally:
        proc.kill()
        for k in shells:
            with contextlib.suppress(ProcessLookupError):
                os.kill(k, signal.SIGKILL)
        proc.wait()


# -------------------------------------------------------------------- errors


@pytest.mark.unchecked_traces("bad trace files on purpose")
@pytest.mark.parametrize("command", ["summary", "memory", "query"])
def test_bad_trace_files(command: str, tmp_path: Path) -> None:
    extra = ["SELECT 1"] if command == "query" else []
    missing = tracer(command, tmp_path / "nope.perfetto-trace", *extra)
    assert_one_line_error(missing, "no such trace file")
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a trace\n")
    assert_one_line_error(tracer(command, text, *extra), "not a Perfetto protobuf trace")
    chrome = tmp_path / "chrome.perfetto-trace"
    chrome.write_text('[{"ph": "X", "name": "a", "ts": 1, "dur": 2}]')
    assert_one_line_error(tracer(command, chrome, *extra), "looks like JSON")
    folder = tmp_path / "no-traces"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello\n")
    assert_one_line_error(tracer(command, folder, *extra), "is a folder with no trace in it")
    empty = tmp_path / "empty.perfetto-trace"
    empty.write_bytes(b"")
    assert_one_line_error(tracer(command, empty, *extra), "empty")


def test_usage_errors_exit_2(trace: Path) -> None:
    assert tracer().returncode == 2
    assert tracer("summary").returncode == 2
    bad = tracer("summary", trace, "--buckets", "0")
    assert bad.returncode == 2
    assert "must be at least 1" in bad.stderr
    huge = tracer("summary", trace, "--buckets", "10001")  # gigabytes to compute, not an answer
    assert huge.returncode == 2
    assert "must be at most 10000" in huge.stderr
    assert tracer("summary", trace, "--engine", "sqlite").returncode == 2


@pytest.mark.parametrize(
    "command",
    [["summary"], ["summary", "--json"], ["memory"], ["query", "SELECT 1"],
     ["open", "--timeout", "1"]],
)
def test_a_closed_stdout_is_a_one_line_error(command: list[str], trace: Path) -> None:
    """`tracer summary T >&-`: Python starts with no sys.stdout; no AttributeError traceback."""
    result = subprocess.run(
        ["sh", "-c", '"$0" -m tracer "$@" >&-', sys.executable, command[0], str(trace),
         *command[1:]],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert_one_line_error(result, "standard output is closed")


def test_help_lists_every_command() -> None:
    result = tracer("--help")
    assert result.returncode == 0
    for command in ("summary", "memory", "query", "open"):
        assert command in result.stdout


#: Run in a fresh interpreter: the commands that answer nothing from a trace's
#: contents, and what they loaded of the query engines' heavy imports.
_LIGHT_COMMANDS = """
import json, sys
from tracer.cli import build_parser, main
build_parser()
status = main(["convert", sys.argv[1], "-o", sys.argv[2]])
heavy = ("pandas", "numpy", "perfetto", "tracer.query.api")
print(json.dumps([status, sorted(m for m in sys.modules if m.startswith(heavy))]))
"""


def test_help_and_convert_load_no_query_engine(tmp_path: Path) -> None:
    """`tracer --help` took 1 s, most of it importing pandas (0.4 s) for commands it did
    not run; now ~0.2 s. Building the parser and converting a timeline load neither
    pandas nor TraceQuery."""
    timeline = tmp_path / "timeline.json"
    timeline.write_text(json.dumps([{
        "cat": "task::f", "name": "task::f", "pid": "Node:10.0.0.1", "tid": "worker:1",
        "ts": 1000.0, "dur": 50.0, "ph": "X", "args": {"task_id": "aa", "name": "f"},
    }]))
    out = subprocess.run(
        [sys.executable, "-c", _LIGHT_COMMANDS, str(timeline), str(tmp_path / "t.perfetto-trace")],
        capture_output=True, text=True, check=True, timeout=120,
    )
    status, heavy = json.loads(out.stdout.splitlines()[-1])
    assert status == 0
    assert heavy == []


def test_console_script(trace: Path) -> None:
    script = Path(sys.executable).with_name("tracer")
    if not script.exists():
        pytest.skip("the `tracer` console script is not installed (pip install -e .)")
    result = subprocess.run([str(script), "summary", str(trace), "--json"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    assert len(data["stages"]) == 2


@pytest.mark.parametrize(("ratio", "shown"), [
    (1.0, "1.00x"), (12.345, "12.35x"), (999.0, "999.00x"), (1000.0, "1.00kx"),
    (10767.62, "10.8kx"), (1880320.0, "1.88Mx"), (None, "-"),
])
def test_ratios_too_big_for_two_decimals_are_said_in_k_and_m(
    ratio: float | None, shown: str
) -> None:
    """A tiny request against a worker's whole RSS (Daft's own 128-byte requests at level
    1) printed as '1880320.00x' (a fresh user's review)."""
    from tracer.cli._output import Style, fmt_ratio

    assert fmt_ratio(ratio, Style(rich=False, color=False)) == shown


def test_summary_lists_the_failed_tasks_with_their_errors(tmp_path: Path) -> None:
    """The Stages table counted failed tasks only: which one, and of what, was nowhere in
    the summary (a fresh user's review). Both engines list them (task_failures)."""
    from tracer.format import TraceWriter
    from tracer.ray import ResourceRequest
    from tracer.ray import layout as L
    from tracer.ray.timeline import RunTimeline, TimelineTask

    path = tmp_path / "failed.perfetto-trace"
    t0 = 1_800_000_000_000_000_000
    ends = {
        "0-0": None,
        "0-1": {L.ARG_STATUS: L.STATUS_FAILED, L.ARG_ERROR_TYPE: "OutOfMemoryError",
                L.ARG_ERROR: "Task was killed due to the node running low on memory.\n"
                             "Memory on the node was 7.5GB / 8GB"},
        "0-2": {L.ARG_STATUS: L.STATUS_CANCELLED, L.ARG_ERROR_TYPE: "TaskCancelledError",
                L.ARG_ERROR: "TaskCancelledError: cancelled by the runner"},
    }
    with TraceWriter(path) as w:
        tl = RunTimeline(w, execution_id="f", runner_name="mine", loop_pid=5, loop_tid=5)
        for i, (task_id, end) in enumerate(ends.items()):
            task = tl.task_created(TimelineTask, task_id, 0, ResourceRequest(num_cpus=1),
                                   t0 + i, stage_name="map")
            tl.task_dispatched(task, t0 + 10 + i)
            tl.task_ended(task, t0 + 50 + i, end)
        tl.close()
    for engine in ("reader", "trace_processor"):
        with TraceQuery(path, QueryConfig(engine=engine)) as q:  # type: ignore[arg-type]
            failures = records(q.task_failures())
        assert [(r["task_id"], r["status"], r["error_type"]) for r in failures] == [
            ("0-1", "failed", "OutOfMemoryError"), ("0-2", "cancelled", "TaskCancelledError")]
        assert failures[0]["error"] == ends["0-1"][L.ARG_ERROR]  # type: ignore[index]
        out = tracer("summary", path, "--engine", engine).stdout
        table = out.split("Failed tasks (2; --json has them all)", 1)[1].split("\n\n", 1)[0]
        rows = [line.split(None, 4) for line in table.splitlines()[3:]]
        assert rows == [
            ["0-1", "0", "map", "failed",
             "OutOfMemoryError: Task was killed due to the node running low on memory."],
            ["0-2", "0", "map", "cancelled", "TaskCancelledError: cancelled by the runner"],
        ], table
    from engines_agree import assert_engines_agree

    assert_engines_agree(path)


def test_memory_says_when_nothing_was_compared(tmp_path: Path) -> None:
    """No task asked for memory: no task is flagged, and `tracer memory` says why rather
    than "every measured task stayed within its request" (fresh user's review 5)."""
    from tracer.format import TraceWriter
    from tracer.ray import ResourceRequest
    from tracer.ray.timeline import RunTimeline, TimelineTask

    path = tmp_path / "no-request.perfetto-trace"
    with TraceWriter(path) as w:
        timeline = RunTimeline(w, execution_id="x", driver_gc=False)
        t0 = w.now()
        task = timeline.task_created(TimelineTask, "0-0", 0, ResourceRequest(memory_bytes=None),
                                     t0, stage_name="map")
        timeline.task_dispatched(task, t0 + 1000)
        timeline.execution({"start_ns": t0 + 2000, "end_ns": t0 + 5000, "node_id": "n1",
                            "pid": 7, "rss_peak": 50 << 20, "rss_start": 40 << 20}, task)
        timeline.task_ended(task, t0 + 6000, None)
        timeline.close()
    out = tracer("memory", path)
    assert out.returncode == 0, out.stderr
    assert "(none: no task requested memory, so none could exceed a request)" in out.stdout
    assert "every measured task stayed within its request" not in out.stdout


def test_the_largest_worker_at_a_kill_is_a_task_worker_not_rays_own(tmp_path: Path) -> None:
    """Ray's own processes are named ``ray::`` too: the summary's "Ray worker using the most
    memory at a kill" named Ray's dashboard agent where it was the largest in the report
    (fresh user's review 6)."""
    from tracer.format import TraceWriter
    from tracer.ray import ResourceRequest
    from tracer.ray import layout as L
    from tracer.ray.timeline import RunTimeline, TimelineTask

    path = tmp_path / "kill.perfetto-trace"
    with TraceWriter(path) as w:
        timeline = RunTimeline(w, execution_id="x", driver_gc=False)
        t0 = w.now()
        task = timeline.task_created(TimelineTask, "0-0", 0, ResourceRequest(memory_bytes=1),
                                     t0, stage_name="hog")
        timeline.task_dispatched(task, t0 + 1000)
        timeline.task_ended(task, t0 + 9000, {
            L.ARG_STATUS: L.STATUS_FAILED, L.ARG_ERROR_TYPE: "OutOfMemoryError",
            L.ARG_MEMORY_AT_KILL: 50 << 20})
        top = [{"pid": 3, "memory": 90 << 20, "command": "ray::DashboardAgent"},
               {"pid": 4, "memory": 80 << 20, "command": "ray::IDLE"},
               {"pid": 7, "memory": 50 << 20, "command": "ray::hog"}]
        timeline.mark(timeline.locate("n1", 7), L.INSTANT_TASK_FAILED, t0 + 9000, {
            L.ARG_TASK_ID: "0-0", L.ARG_ERROR_TYPE: "OutOfMemoryError",
            L.ARG_MEMORY_AT_KILL: 50 << 20, L.ARG_OOM_TOP_MEMORY_USERS: top})
        timeline.close()
    out = tracer("summary", path)
    assert out.returncode == 0, out.stderr
    assert ("The Ray worker using the most memory at a kill, by Ray's report: ray::hog "
            "(pid 7, 50.0 MiB)") in out.stdout, out.stdout

"""An OOM kill that Ray retried, for real: the retry succeeds, and the kill is still there.

Ray retries a task whose worker its OOM killer killed (without limit by
default), so the kills that make a job slow and flaky are mostly of tasks
that end well: the runner sees a result, nothing else. The trace showed
nothing of such a kill but an attempt count on the task's slice; the memory
tables called the stage fine and suggested a smaller request, and a budget
test passed (fresh user's review 5). Ray's task events keep the killed
attempt with Ray's OOM report, which the tracer reads at levels 1 and 2 (this
run is at level 2, which memory-budget tests need).

As in test_memory_oom.py, the run is a subprocess with its own Ray, the kill
threshold ~1 GiB above the machine's memory use: partition 1's first attempt
grows until it is killed, its retry allocates ~30 MB and returns.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import oom_jobs
import pytest
from engines_agree import assert_engines_agree
from ray_trace_checks import check_well_formed

from tracer.format import read_trace
from tracer.query import QueryConfig, TraceQuery, records
from tracer.ray import layout as L

MIB = 1 << 20
REQUEST = 64 * MIB

JOB = oom_jobs.preamble(1) + r"""
import ray
from tracer.runner import Pipeline, Stage

MARKERS = sys.argv[3]

def hog(n):
    marker = os.path.join(MARKERS, f"{n}")
    if n == 0 or os.path.exists(marker):
        keep = bytearray(30_000_000)  # a partition that fits, and the retry
        keep[::4096] = b"\x01" * len(range(0, len(keep), 4096))
        return os.getpid()
    open(marker, "w").close()
    chunks = []
    for _ in range(18):  # up to 1.8 GB, touched page by page, until killed
        chunk = bytearray(100_000_000)
        chunk[::4096] = b"\x01" * len(range(0, len(chunk), 4096))
        chunks.append(chunk)
        time.sleep(0.05)
    return -1  # not killed: the test says so

ray.init(address="local", num_cpus=1, object_store_memory=78643200,
         include_dashboard=False, log_to_driver=False)
stage = Stage("hog", hog, memory_bytes=int(sys.argv[2]), max_retries=1)
out = Pipeline([0, 1], [stage]).run(tracing_level=2, trace_path=sys.argv[1], progress=False)
print("RESULT " + json.dumps({"pids": out}))
"""


@pytest.fixture(scope="module")
def retried(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("oom-retried")
    (tmp / "markers").mkdir()
    trace = tmp / "retried.perfetto-trace"
    result = oom_jobs.run_job(tmp, JOB, [str(trace), str(REQUEST), str(tmp / "markers")])
    assert -1 not in result["pids"], "the first attempt was not killed"
    result["trace"] = trace
    return result


def test_a_retried_kill_is_drawn_where_it_happened(retried: dict[str, Any]) -> None:
    model = read_trace(retried["trace"])
    assert not model.problems, [str(p) for p in model.problems]
    check_well_formed(model)
    tasks = {s.args[L.ARG_TASK_ID]: s for s in model.slices
             if s.category == L.CAT_TASK and s.depth == 0}
    assert L.ARG_STATUS not in tasks["0-1"].args  # the retry succeeded: the run did
    assert tasks["0-1"].args[L.ARG_RAY_ATTEMPTS] == 2
    # The killed attempt's mark, on the killed worker, with Ray's OOM report.
    (mark,) = [i for i in model.instants if i.name == L.INSTANT_TASK_FAILED]
    assert mark.args[L.ARG_TASK_ID] == "0-1"
    assert mark.args[L.ARG_RETRIED] is True and mark.args[L.ARG_RAY_ATTEMPT] == 0
    assert mark.args[L.ARG_ERROR_TYPE] == "OutOfMemoryError"
    assert mark.args[L.ARG_MEMORY_AT_KILL] > 300 * MIB  # it grew well past its request
    assert mark.args[L.ARG_MEMORY_REQUESTED] == REQUEST
    worker = model.tracks[mark.track_uuid]
    assert worker.name is not None and worker.name.startswith(L.WORKER_THREAD_PREFIX)
    killed_pid = int(worker.name.split()[-1])
    top = mark.args[L.ARG_OOM_TOP_MEMORY_USERS]
    assert next(u for u in top if u["pid"] == killed_pid)["command"] == "ray::hog"
    # The attempt itself, on that worker, from when it ran until the kill.
    (attempt,) = [s for s in model.slices if s.category == L.CAT_ATTEMPT]
    assert attempt.name == L.SLICE_FAILED_ATTEMPT_PREFIX + "hog"
    assert attempt.track_uuid == mark.track_uuid and attempt.ts + (attempt.dur or 0) == mark.ts
    assert (attempt.dur or 0) > 50_000_000  # it ran a while (18 x 50 ms at most)
    assert tasks["0-1"].ts < attempt.ts
    # The task's lane of Ray's states has its attempts' one after another: the killed
    # one's (it ran, and failed), then the retry's (the lane was blank while it ran).
    (head,) = [s for s in model.slices if (s.name or "").startswith(L.RAY_STATES_PREFIX)
               and s.args.get(L.ARG_TASK_ID) == "0-1"]
    names = [s.name for s in sorted((s for s in model.slices if s.parent_id == head.id),
                                    key=lambda s: s.ts)]
    assert names.count(L.STATE_RUNNING) == 2 and L.STATE_FAILED in names, names
    assert names.index(L.STATE_FAILED) < len(names) - 1  # (the retry's states after it)
    # The retry ran in another worker (Ray's killed one is gone), measured.
    (execution,) = [s for s in model.slices if s.category == L.CAT_EXECUTION
                    and s.args.get(L.ARG_TASK_ID) == "0-1"]
    assert execution.args[L.ARG_RAY_ATTEMPT] == 1 and execution.ts > mark.ts
    assert retried["pids"][1] != killed_pid
    # The node's memory counters count the killed attempt while it ran: its request, and
    # its worker's memory at the kill (they had nothing of it: it has no execution), so
    # the memory that got it killed shows on the node.
    node_uuid = worker.parent_uuid
    (used,) = [t.uuid for t in model.tracks.values()
               if t.name == L.COUNTER_NODE_MEMORY_USED and t.parent_uuid == node_uuid]
    at_kill = mark.args[L.ARG_MEMORY_AT_KILL]
    # (counter times are kept to 0.1 ms, and their values in KiB)
    during = [c for c in model.counters if c.track_uuid == used
              and attempt.ts - 100_000 <= c.ts < mark.ts]
    assert during and max(c.value for c in during) >= at_kill - 1024, during
    # The killed worker (one CPU: it ran partition 0 first) leaves its memory counter at
    # the kill, where it had kept partition 0's figures to the trace's end.
    rss = [t.uuid for t in model.tracks.values()
           if t.name == L.COUNTER_WORKER_RSS and t.parent_uuid == mark.track_uuid]
    if retried["pids"][0] == killed_pid:
        (track,) = rss
        samples = [c for c in model.counters if c.track_uuid == track]
        # (counter times are kept to 0.1 ms: tracer.ray.timeline.memory.TIME_UNIT_NS)
        assert samples[-1].value == 0 and 0 <= mark.ts - samples[-1].ts < 100_000, samples[-3:]


def test_the_answers_count_the_kill_and_size_the_request_by_it(retried: dict[str, Any]) -> None:
    trace = retried["trace"]
    assert_engines_agree(trace)
    model = read_trace(trace)
    (mark,) = [i for i in model.instants if i.name == L.INSTANT_TASK_FAILED]
    killed_worker = model.tracks[mark.track_uuid]
    killed_node = model.tracks[killed_worker.parent_uuid]
    (attempt,) = [s for s in model.slices if s.category == L.CAT_ATTEMPT]
    for engine in ("reader", "trace_processor"):
        with TraceQuery(trace, QueryConfig(engine=engine)) as q:
            (retry,) = records(q.task_retries())
            assert (retry["task_id"], retry["status"], retry["ray_attempts"]) == ("0-1", "ok", 2)
            assert retry["failed_attempts_seen"] == 1
            assert retry["error_type"] == "OutOfMemoryError"
            at_kill = retry["memory_at_kill"]
            assert at_kill > 300 * MIB
            # Where the attempt failed, and how long it ran first (work done again).
            assert (retry["failed_node"], retry["failed_worker"]) == (
                killed_node.name, killed_worker.name)
            assert retry["lost_ns"] == attempt.dur
            (stage,) = records(q.memory_by_stage())
            assert stage["oom_killed"] == 1, engine
            (flagged,) = [r for r in records(q.memory_flagged()) if r["task_id"] == "0-1"]
            assert flagged["reason"] == "oom killed" and flagged["peak_bytes"] == at_kill
            assert flagged["peak_source"] == "at kill"
            # On the worker Ray killed, not the one its retry ran on (fresh user's review 7).
            assert (flagged["node"], flagged["worker"]) == (killed_node.name, killed_worker.name)
            (suggestion,) = records(q.memory_suggestions())
            assert suggestion["suggested_bytes"] >= at_kill > REQUEST  # more, not less
            assert set(q.oom_reports()["task_id"]) == {"0-1"}
    out = subprocess.run([sys.executable, "-m", "tracer", "summary", str(trace)],
                         capture_output=True, text=True, check=True).stdout
    assert "Retried tasks: Ray ran them again (1;" in out, out
    assert "OutOfMemoryError at " in out and "1 of 'hog'" in out, out
    assert "The failed attempts seen ran " in out and killed_worker.name in out, out


def test_a_memory_budget_test_fails_on_a_kill_ray_retried(retried: dict[str, Any]) -> None:
    """The traced_memory fixture's run, read from this trace: the retry's heap fits its
    request, but its first attempt was killed, which the budget checks see."""
    from tracer.testing import MemoryBudgetError
    from tracer.testing.run import TracedRun

    run = TracedRun(retried["trace"].parent)
    run._load()
    (task,) = [t for t in run.stages["hog"] if t.task_id == "0-1"]
    assert task.status == "ok" and task.oom_killed and task.peak_source == "heap"
    assert task.peak is not None and task.peak < REQUEST  # the retry's own heap
    assert task.killed_at is not None and task.used == task.killed_at > REQUEST
    with pytest.raises(MemoryBudgetError, match="killed by Ray's OOM killer"):
        run.assert_no_oom_kill()
    with pytest.raises(MemoryBudgetError):
        run.assert_stage_peak("hog", "64 MiB")

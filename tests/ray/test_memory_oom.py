"""A task killed by Ray's OOM killer, for real: what the caller gets, what the trace shows.

Ray's memory monitor reads its settings when Ray starts, so the run happens in
a subprocess with its own Ray: the kill threshold is set ~1 GiB above the
machine's memory use at that moment, and a task of the traced pipeline (level
2, so under memray) allocates up to 1.8 GB, 100 MB at a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import oom_jobs
import pandas as pd
import pytest
from engines_agree import assert_engines_agree
from ray_trace_checks import check_well_formed

from tracer.format import read_trace
from tracer.ray import layout as L

MIB = 1 << 20
REQUEST = 64 * MIB

JOB = oom_jobs.preamble(0) + r"""
import ray
from tracer.runner import Pipeline, Stage

def hog(n):
    if n == 0:
        return 0  # a partition that fits
    chunks = []
    for _ in range(18):  # up to 1.8 GB, touched page by page
        chunk = bytearray(100_000_000)
        chunk[::4096] = b"\x01" * len(range(0, len(chunk), 4096))
        chunks.append(chunk)
        time.sleep(0.05)
    return len(chunks)

ray.init(address="local", num_cpus=int(sys.argv[3]), object_store_memory=78643200,
         include_dashboard=False, log_to_driver=False)
stage = Stage("hog", hog, memory_bytes=int(sys.argv[2]), max_retries=0)
try:
    Pipeline(json.loads(sys.argv[4]), [stage]).run(
        tracing_level=2, trace_path=sys.argv[1], progress=False)
    result = {"error": None}
except BaseException as exc:
    result = {
        "error": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "is_oom": isinstance(exc, ray.exceptions.OutOfMemoryError),
        "message": str(exc)[:3000],
    }
print("RESULT " + json.dumps(result))
"""


def run_job(tmp: Path, num_cpus: int, partitions: list[int]) -> dict[str, Any]:
    """The job in a process of its own: partition 0 fits, the others grow until killed."""
    trace = tmp / "oom.perfetto-trace"
    result = oom_jobs.run_job(
        tmp, JOB, [str(trace), str(REQUEST), str(num_cpus), json.dumps(partitions)])
    result["trace"] = trace
    return result


@pytest.fixture(scope="module")
def oom(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One CPU: the partition that fits, then one that is killed (the same worker)."""
    return run_job(tmp_path_factory.mktemp("oom"), 1, [0, 1])


def test_the_caller_gets_ray_out_of_memory_error(oom: dict[str, Any]) -> None:
    assert oom["error"] == "ray.exceptions.OutOfMemoryError", oom
    assert oom["is_oom"]
    assert "low on memory" in oom["message"]


def test_the_trace_shows_the_kill_where_it_happened(oom: dict[str, Any]) -> None:
    model = read_trace(oom["trace"])
    assert not model.problems, [str(p) for p in model.problems]
    check_well_formed(model)

    tasks = {
        s.args[L.ARG_TASK_ID]: s
        for s in model.slices
        if s.category == L.CAT_TASK and s.depth == 0
    }
    assert set(tasks) == {"0-0", "0-1"}
    assert L.ARG_STATUS not in tasks["0-0"].args
    killed = tasks["0-1"].args
    assert killed[L.ARG_STATUS] == "failed"
    assert killed[L.ARG_ERROR_TYPE] == "OutOfMemoryError"
    assert "low on memory" in killed[L.ARG_ERROR] and "OOM kill reason" in killed[L.ARG_ERROR]
    assert killed[L.ARG_MEMORY_REQUESTED] == REQUEST
    assert_engines_agree(oom["trace"])
    # Ray names the node and the worker process; the killed worker used more than requested.
    assert killed[L.ARG_MEMORY_AT_KILL] > REQUEST
    node_id, pid = killed[L.ARG_NODE_ID], killed[L.ARG_WORKER_PID]
    assert len(node_id) >= 16 and pid > 0

    # The partition that fit ran on the same node, measured by memray.
    (ok,) = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    assert ok.args[L.ARG_TASK_ID] == "0-0" and ok.args[L.ARG_HEAP_PEAK] >= 0
    node = _process_of(model, ok.track_uuid)
    assert node.name is not None and node.name.startswith(L.NODE_PROCESS_PREFIX)
    assert node_id.startswith(node.name.split("(")[1].rstrip(")"))

    # The kill is marked on that node, on the killed worker's thread.
    (mark,) = [i for i in model.instants if i.name == L.INSTANT_TASK_FAILED]
    assert mark.category == L.CAT_EXECUTION
    assert mark.args[L.ARG_TASK_ID] == "0-1"
    assert mark.args[L.ARG_ERROR_TYPE] == "OutOfMemoryError"
    assert mark.args[L.ARG_MEMORY_AT_KILL] == killed[L.ARG_MEMORY_AT_KILL]
    worker = model.tracks[mark.track_uuid]
    assert worker.kind == "track" and worker.name == f"{L.WORKER_THREAD_PREFIX} {pid}"
    assert _process_of(model, mark.track_uuid).uuid == node.uuid
    # When the runner saw it: after the task was dispatched, before the task slice ended.
    assert tasks["0-1"].ts <= mark.ts <= tasks["0-1"].ts + (tasks["0-1"].dur or 0)
    # Ray's states of the killed task (it has no execution): pushed to its worker, failed
    # (RUNNING too, but the worker reports it: killed before its next report, it is lost).
    (head,) = [s for s in model.slices if (s.name or "").startswith(L.RAY_STATES_PREFIX)
               and s.args.get(L.ARG_TASK_ID) == "0-1"]
    assert head.name == L.RAY_STATES_PREFIX + "hog"
    states = sorted((s for s in model.slices if s.parent_id == head.id), key=lambda s: s.ts)
    names = [s.name for s in states]
    assert L.STATE_SUBMITTED in names and names[-1] == L.STATE_FAILED, names
    assert states[-1].ts <= mark.ts
    # The killed worker's memory counters (if it ran the partition that fit: one CPU,
    # one worker) end at 0 where the kill was seen, not at its last task's figures.
    rss = [t.uuid for t in model.tracks.values()
           if t.name == L.COUNTER_WORKER_RSS and t.parent_uuid == mark.track_uuid]
    if rss:
        samples = [c for c in model.counters if c.track_uuid == rss[0]]
        # (counter times are kept to 0.1 ms: tracer.ray.timeline.memory.TIME_UNIT_NS)
        assert samples[-1].value == 0 and 0 <= mark.ts - samples[-1].ts < 100_000, samples[-3:]
        assert max(c.value for c in samples) > 0
    # The node's memory counters count it until the kill: its request, and the memory its
    # worker used (they had nothing of it: it has no execution).
    used = [t.uuid for t in model.tracks.values()
            if t.name == L.COUNTER_NODE_MEMORY_USED and t.parent_uuid == node.uuid]
    requested = [t.uuid for t in model.tracks.values()
                 if t.name == L.COUNTER_NODE_MEMORY_REQUESTED and t.parent_uuid == node.uuid]
    assert used and requested
    # (counters are kept in KiB)
    assert max(c.value for c in model.counters if c.track_uuid == used[0]) >= (
        killed[L.ARG_MEMORY_AT_KILL] - 1024)
    assert max(c.value for c in model.counters if c.track_uuid == requested[0]) >= REQUEST
    # Where it ran, as the memory report says (both engines).
    from tracer.query import QueryConfig, TraceQuery, records
    (flagged,) = records(TraceQuery(oom["trace"], QueryConfig(engine="reader")).memory_flagged())
    assert flagged["task_id"] == "0-1" and flagged["reason"] == "oom killed"
    (by_node,) = records(TraceQuery(oom["trace"], QueryConfig(engine="reader")).memory_by_node())
    assert (by_node["node"], by_node["tasks"], by_node["oom_killed"]) == (node.name, 1, 1)
    assert flagged["node"] == node.name and flagged["worker"] == worker.name
    # Ray's report of the node's largest processes at the kill is on the mark: the killed
    # worker is there, named by what it ran; both engines list it, and tracer memory.
    top = mark.args[L.ARG_OOM_TOP_MEMORY_USERS]
    assert {"pid": pid, "command": "ray::hog"}.items() <= next(
        u for u in top if u["pid"] == pid).items()
    assert [u["memory"] for u in top] == sorted((u["memory"] for u in top), reverse=True)
    reports = TraceQuery(oom["trace"], QueryConfig(engine="reader")).oom_reports()
    assert list(reports["pid"]) == [u["pid"] for u in top]
    assert set(reports["task_id"]) == {"0-1"} and set(reports["node"]) == {node.name}
    with TraceQuery(oom["trace"], QueryConfig(engine="trace_processor")) as tp:
        pd.testing.assert_frame_equal(tp.oom_reports(), reports)
    memory = subprocess.run([sys.executable, "-m", "tracer", "memory", str(oom["trace"])],
                            capture_output=True, text=True, check=True).stdout
    assert "Ray's OOM report 1 of 1" in memory and "ray::hog" in memory, memory
    as_json = subprocess.run([sys.executable, "-m", "tracer", "memory", str(oom["trace"]),
                              "--json"], capture_output=True, text=True, check=True).stdout
    assert json.loads(as_json)["oom_reports"] == records(reports)
    # The summary says it too, where a failed task would otherwise look like any other.
    out = subprocess.run([sys.executable, "-m", "tracer", "summary", str(oom["trace"]),
                          "--engine", "reader"], capture_output=True, text=True, check=True)
    assert ("Killed by Ray's OOM killer (tasks, or an attempt Ray ran again): 1 of 'hog'; "
            "`tracer memory ") in out.stdout, out.stdout
    assert ("The Ray worker using the most memory at a kill, by Ray's report: ray::hog "
            f"(pid {pid}, ") in out.stdout, out.stdout


def _process_of(model: Any, uuid: int) -> Any:
    track = model.tracks[uuid]
    while track is not None and not (track.name or "").startswith(L.NODE_PROCESS_PREFIX):
        track = model.parent_of(track.uuid)
    assert track is not None
    return track


def test_workers_killed_at_once_are_not_all_the_first_one(tmp_path: Path) -> None:
    """Two partitions grow side by side on two CPUs: Ray (2.60) kills both workers in
    one round and hands each task the same report, naming both workers with their
    memory. It does not say which ran which task: neither task is put on the first
    worker named (both were, with its memory), each says the workers killed with it,
    its memory at the kill is the least of theirs (a lower bound), and its mark is on
    the node. Where Ray killed them one at a time, each names its own worker."""
    result = run_job(tmp_path, 2, [1, 2])
    assert result["error"] == "ray.exceptions.OutOfMemoryError", result
    model = read_trace(result["trace"])
    assert not model.problems, [str(p) for p in model.problems]
    check_well_formed(model)
    killed = [s.args for s in model.slices if s.category == L.CAT_TASK and s.depth == 0]
    assert [k[L.ARG_ERROR_TYPE] for k in killed] == ["OutOfMemoryError"] * 2, killed
    marks = {i.args[L.ARG_TASK_ID]: i for i in model.instants
             if i.name == L.INSTANT_TASK_FAILED}
    together = [k for k in killed if L.ARG_OOM_KILLED_WORKERS in k]
    if not together:
        pytest.skip("Ray killed the two workers one at a time (Ray 2.50's policy)")
    for k in together:
        workers = {int(pid): used for pid, used in k[L.ARG_OOM_KILLED_WORKERS].items()}
        assert len(workers) >= 2 and all(used > REQUEST for used in workers.values())
        assert L.ARG_WORKER_PID not in k
        assert k[L.ARG_MEMORY_AT_KILL] == min(workers.values())
        mark = marks[k[L.ARG_TASK_ID]]
        node = model.tracks[mark.track_uuid]
        assert (node.name or "").startswith(L.NODE_PROCESS_PREFIX), node
        assert mark.args[L.ARG_OOM_KILLED_WORKERS] == k[L.ARG_OOM_KILLED_WORKERS]
    # The memory report puts each on its node; on the worker Ray's events say ran it, with
    # that worker's memory, where they say (its states' slice names it: the worker
    # reports that it runs the task, lost if it was killed before its next report), else
    # on no worker, with the lower bound.
    from tracer.query import QueryConfig, TraceQuery, records
    ran_in = {s.args[L.ARG_TASK_ID]: s.args.get(L.ARG_WORKER_PID) for s in model.slices
              if (s.name or "").startswith(L.RAY_STATES_PREFIX)}
    flagged = records(TraceQuery(result["trace"], QueryConfig(engine="reader")).memory_flagged())
    assert sorted(f["task_id"] for f in flagged) == sorted(k[L.ARG_TASK_ID] for k in killed)
    for f in flagged:
        assert f["reason"] == "oom killed" and f["node"] is not None
        (k,) = [k for k in killed if k[L.ARG_TASK_ID] == f["task_id"]]
        if k not in together:
            continue
        pid = ran_in.get(f["task_id"])
        workers = {int(p): used for p, used in k[L.ARG_OOM_KILLED_WORKERS].items()}
        if pid in workers:
            assert (f["worker"], f["peak_bytes"]) == (f"{L.WORKER_THREAD_PREFIX} {pid}",
                                                      workers[pid])
        else:
            assert (f["worker"], f["peak_bytes"]) == (None, min(workers.values()))
    pids = [ran_in.get(k[L.ARG_TASK_ID]) for k in together]
    assert None in pids or len(set(pids)) == len(pids), pids  # never both on one worker
    assert_engines_agree(result["trace"])

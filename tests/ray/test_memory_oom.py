"""A task killed by Ray's OOM killer, for real: what the caller gets, what the trace shows.

Ray's memory monitor reads its settings when Ray starts, so the run happens in
a subprocess with its own Ray: the kill threshold is set ~1 GiB above the
machine's memory use at that moment, and a task of the traced pipeline (level
2, so under memray) allocates up to 1.8 GB, 100 MB at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from engines_agree import assert_engines_agree
from ray_trace_checks import check_well_formed

from tracer.format import read_trace
from tracer.ray import layout as L

MIB = 1 << 20
REQUEST = 64 * MIB

JOB = r"""
import json, os, sys, time

def used_fraction():
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":")
            info[key] = int(value.split()[0]) * 1024
    return 1 - info["MemAvailable"] / info["MemTotal"], info["MemTotal"]

used, total = used_fraction()
threshold = used + (1 << 30) / total
if threshold > 0.9:
    print("RESULT " + json.dumps({"skip": f"memory already {used:.0%} used"}))
    sys.exit(0)
os.environ["RAY_memory_usage_threshold"] = f"{threshold:.4f}"
os.environ["RAY_memory_monitor_refresh_ms"] = "100"
os.environ["RAY_task_oom_retries"] = "0"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

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

ray.init(address="local", num_cpus=1, object_store_memory=78643200,
         include_dashboard=False, log_to_driver=False)
stage = Stage("hog", hog, memory_bytes=int(sys.argv[2]), max_retries=0)
try:
    Pipeline([0, 1], [stage]).run(tracing_level=2, trace_path=sys.argv[1], progress=False)
    result = {"error": None}
except BaseException as exc:
    result = {
        "error": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "is_oom": isinstance(exc, ray.exceptions.OutOfMemoryError),
        "message": str(exc)[:3000],
    }
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def oom(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("oom")
    script = tmp / "job.py"
    script.write_text(JOB)
    trace = tmp / "oom.perfetto-trace"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_AUTH_MODE"] = "disabled"
    proc = subprocess.run(
        [sys.executable, str(script), str(trace), str(REQUEST)],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    if "skip" in result:
        pytest.skip(result["skip"])
    result["trace"] = trace
    return result


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


def _process_of(model: Any, uuid: int) -> Any:
    track = model.tracks[uuid]
    while track is not None and not (track.name or "").startswith(L.NODE_PROCESS_PREFIX):
        track = model.parent_of(track.uuid)
    assert track is not None
    return track

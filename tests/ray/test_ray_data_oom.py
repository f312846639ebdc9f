"""A Ray Data map task killed by Ray's OOM killer, for real: the user's error, the trace.

Ray's memory monitor reads its settings when Ray starts, so the pipeline runs
in a subprocess with its own Ray (as in test_memory_oom.py): the kill
threshold is ~1 GiB above the machine's memory use at that moment, and one
block's task (level 2, under memray) allocates up to 1.8 GB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="Ray Data needs pip install -e '.[raydata]'")

import oom_jobs
from engines_agree import assert_engines_agree
from ray_trace_checks import check_well_formed

from tracer.format import read_trace
from tracer.ray import layout as L

MIB = 1 << 20
REQUEST = 64 * MIB

JOB = oom_jobs.preamble(0) + r"""
import ray, ray.data
import tracer.integrations.ray_data as traced_data

def hog(batch):
    if 1 not in list(batch["id"]):
        return batch  # the blocks that fit
    chunks = []
    for _ in range(18):  # up to 1.8 GB, touched page by page
        chunk = bytearray(100_000_000)
        chunk[::4096] = b"\x01" * len(range(0, len(chunk), 4096))
        chunks.append(chunk)
        time.sleep(0.05)
    return batch

ray.init(address="local", num_cpus=1, object_store_memory=78643200,
         include_dashboard=False, log_to_driver=False)
ray.data.DataContext.get_current().enable_progress_bars = False
traced_data.enable(level=2, path=sys.argv[1])
try:
    ray.data.range(2, override_num_blocks=2).map_batches(
        hog, memory=int(sys.argv[2]), max_retries=0).materialize()
    result = {"error": None}
except BaseException as exc:
    chain, todo = [], [exc]
    while todo:
        e = todo.pop()
        chain.append(type(e).__name__)
        todo.extend(c for c in (getattr(e, "cause", None), e.__cause__)
                    if isinstance(c, BaseException) and type(c).__name__ not in chain)
    result = {"error": chain, "message": str(exc)[:3000]}
result["traces"] = [str(p) for p in traced_data.trace_paths()]
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def oom(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("ray-data-oom")
    return oom_jobs.run_job(tmp, JOB, [str(tmp / "traces"), str(REQUEST)], timeout=240,
                            drop_tracer_env=True)


def test_the_user_gets_the_out_of_memory_error(oom: dict[str, Any]) -> None:
    assert oom["error"] and "OutOfMemoryError" in oom["error"], oom
    assert "low on memory" in oom["message"]


def test_the_kill_is_marked_where_it_happened(oom: dict[str, Any]) -> None:
    (path,) = oom["traces"]
    model = read_trace(path)
    assert not model.problems, [str(p) for p in model.problems]
    check_well_formed(model)
    tasks = {s.args[L.ARG_TASK_ID]: s for s in model.slices
             if s.category == L.CAT_TASK and s.depth == 0}
    killed = [t for t in tasks.values() if t.args.get(L.ARG_ERROR_TYPE) == "OutOfMemoryError"]
    assert len(killed) == 1, [t.args for t in tasks.values()]
    args = killed[0].args
    assert args[L.ARG_STATUS] == L.STATUS_FAILED and "low on memory" in args[L.ARG_ERROR]
    assert args[L.ARG_RESOURCE_REQUEST]["memory_bytes"] == REQUEST
    assert args[L.ARG_MEMORY_AT_KILL] > REQUEST
    node_id, pid = args[L.ARG_NODE_ID], args[L.ARG_WORKER_PID]

    (mark,) = [i for i in model.instants if i.name == L.INSTANT_TASK_FAILED]
    assert mark.args[L.ARG_TASK_ID] == args[L.ARG_TASK_ID]
    assert mark.args[L.ARG_MEMORY_AT_KILL] == args[L.ARG_MEMORY_AT_KILL]
    worker = model.tracks[mark.track_uuid]
    assert worker.name == f"{L.WORKER_THREAD_PREFIX} {pid}"
    node = model.parent_of(worker.uuid)
    assert node is not None and node.name is not None and node_id[:8] in node.name
    # Ray's report of the node's largest processes at the kill: the killed worker's there.
    assert pid in {u["pid"] for u in mark.args[L.ARG_OOM_TOP_MEMORY_USERS]}
    # Ray's states of the killed task (it has no execution): pushed to its worker, failed
    # (RUNNING too, but the worker reports it: killed before its next report, it is lost).
    (head,) = [s for s in model.slices if (s.name or "").startswith(L.RAY_STATES_PREFIX)
               and s.args.get(L.ARG_TASK_ID) == args[L.ARG_TASK_ID]]
    states = sorted((s for s in model.slices if s.parent_id == head.id), key=lambda s: s.ts)
    names = [s.name for s in states]
    assert L.STATE_SUBMITTED in names and names[-1] == L.STATE_FAILED, names
    # Its measurements never come (the worker died): not counted as lost.
    (run,) = [s for s in model.slices if s.name == L.SLICE_EXECUTION and s.depth == 0]
    assert run.args[L.ARG_LOST_MEASUREMENTS] == 0
    assert "OutOfMemoryError" in run.args[L.ARG_ERROR_TYPE] or run.args[L.ARG_ERROR]
    assert_engines_agree(Path(path))

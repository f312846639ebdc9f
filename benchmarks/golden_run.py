"""A deterministic run through the runner tracer: the same trace, byte for byte, every time.

For refactors of the Ray layer: run it before and after a change, on the same
machine, and compare the printed digests (or the written files). It drives
:class:`tracer.ray.RunnerTracer` through its public calls with a fixed clock
(1 µs per reading), a fixed driver pid and tid, and measurements it makes
itself (``ray.put`` of packed measurement dicts, registered as the tasks'
return-channel refs: real Ray, no task runs), so nothing in the trace
depends on timing:

* waves with plan polling, batching, dispatching and awaiting slices, marks,
  tasks-in-flight counters;
* two stages; tasks received one by one and in batches; a task created again
  under its id (superseded); a retried task (Ray attempt 1); a task that failed
  (an error naming its worker); a cancelled one whose measurements come back;
  a task created after its stage was done; tasks still in flight at the close;
* level 2 measurements (heap, RSS samples, allocations) on two nodes and three
  workers, some over their request.

    .venv/bin/python benchmarks/golden_run.py               # prints the sha256
    .venv/bin/python benchmarks/golden_run.py --out t.perfetto-trace

The trace is written uncompressed: compressed bundles depend on when the
background flusher ran.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import threading
from pathlib import Path
from typing import Any
from unittest import mock

import ray

from tracer.format import TraceWriter
from tracer.ray import ResourceRequest, RunnerTracer, TracingLevel
from tracer.ray.task_metrics import pack_metrics

T0 = 1_800_000_000_000_000_000
MIB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        self.now += 1_000
        return self.now


def measurements(i: int, clock: Clock, *, attempt: int = 0) -> dict[str, Any]:
    """What a level-2 task on node A or B, worker 101-103, would report."""
    start = clock.now + 200_000
    end = start + 5_000_000 + 100_000 * i
    node = "a" * 40 if i % 2 else "b" * 40
    m: dict[str, Any] = {
        "start_ns": start,
        "end_ns": end,
        "pid": 101 + i % 3,
        "node_id": node,
        "ray_task_id": f"{i:048x}",
        "assigned_resources": {"CPU": 1.0},
        "heap_peak": (i + 1) * MIB,
        "allocations": 10 + i,
        "heap_retained": i * 1000,
        "rss_peak": 100 * MIB + i * MIB,
        "rss_start": 90 * MIB,
        "rss_end": 95 * MIB,
        "memory_samples": [
            [start // 1_000_000 + k * 10, k * MIB, 90 * MIB + k * MIB] for k in range(3)
        ],
    }
    if attempt:
        m["attempt"] = attempt
    return m


def run(path: Path) -> None:
    clock = Clock()
    with mock.patch("time.time_ns", return_value=T0):  # the snapshot's realtime reading
        writer = TraceWriter(path, clock=clock, compress=False)
    with mock.patch("os.getpid", return_value=4242), mock.patch.object(
        threading, "get_native_id", return_value=4242
    ):
        tracer = RunnerTracer(
            writer, execution_id="golden", runner_name="golden", level=TracingLevel.MEMORY,
            cluster_resources={"CPU": 4.0, "GPU": 0.0, "memory": 8.0 * (1 << 30)},
        )
    tracer._flusher.stop(join=True)  # flushes move bytes only; keep the run single-threaded
    small = ResourceRequest(num_cpus=1, memory_bytes=2 * MIB)
    big = ResourceRequest(num_cpus=1, num_gpus=0, memory_bytes=64 * MIB)

    def dispatch(task_id: str, i: int, *, attempt: int = 0) -> None:
        tracer.task_dispatched(task_id)
        ref = ray.put(pack_metrics(measurements(i, clock, attempt=attempt)))
        tracer.register_metrics_ref(task_id, ref)

    with tracer.dispatch_wave(0) as wave:
        with tracer.get_next_physical_plan():
            tracer.mark_handle_task_add_to_batch()
        with tracer.dispatch_batching():
            for i in range(4):
                tracer.task_created(f"0-{i}", 0, small, "inflate")
        with tracer.dispatching():
            for i in range(4):
                dispatch(f"0-{i}", i)
                tracer.mark_dispatch_task()
        tracer.count_inflight_tasks(4)
        with tracer.awaiting(num_returns=1, timeout=0.1) as ready:
            ready(num_ready=2)
        tracer.task_received_as_ready("0-0")
        tracer.tasks_received_as_ready(["0-1", "0-2"])
        wave(dispatched=4)
    with tracer.dispatch_wave(1):
        tracer.mark_handle_none_task()
        tracer.task_created("0-4", 0, small, "inflate")
        dispatch("0-4", 4, attempt=1)  # Ray retried it
        tracer.task_created("0-5", 0, small, "inflate")
        tracer.task_created("0-5", 0, small, "inflate")  # the runner created it again
        dispatch("0-5", 5)
        tracer.task_created("0-6", 0, small, "inflate")
        tracer.task_dispatched("0-6")
        tracer.task_failed("0-6", RuntimeError(f"worker pid=103 died on node ID: {'a' * 40}"))
        tracer.task_created("0-7", 0, small, "inflate")
        dispatch("0-7", 7)
        tracer.task_cancelled("0-7")
        tracer.mark_noop_task_start()
        tracer.mark_noop_task_end()
        tracer.tasks_received_as_ready(["0-3", "0-4", "0-5"])
        failures = tracer.complete_received()
        assert failures == {}, failures
        tracer.count_inflight_tasks(0)
    tracer.stage_done(0)
    with tracer.dispatch_wave(2):
        tracer.mark_handle_materialized_result()
        for i in range(8, 12):
            tracer.task_created(f"1-{i}", 1, big, "deflate", stage_name="deflate")
            dispatch(f"1-{i}", i)
        tracer.task_created("0-12", 0, small, "inflate")  # after the stage was done
        dispatch("0-12", 12)
        tracer.tasks_received_as_ready(["1-8", "1-9", "0-12"])
        tracer.complete_received()
    tracer.task_created("1-13", 1, big, "deflate")  # still in flight at the close
    tracer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also keep the trace here")
    args = parser.parse_args()
    ray.init(num_cpus=1, object_store_memory=78643200, include_dashboard=False,
             log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = args.out or Path(tmp) / "golden.perfetto-trace"
            run(path)
            data = path.read_bytes()
    finally:
        ray.shutdown()
    print(f"{hashlib.sha256(data).hexdigest()}  {len(data)} bytes")


if __name__ == "__main__":
    main()

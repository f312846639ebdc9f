"""memray's public FileReader following a Ray worker's one live tracker, task by task.

Why this exists: level 2 keeps one memray tracker per Ray worker and reads each
task's part of its capture with tracer's own C reader (tracer/ray/_memray_reader.c),
which is not memray's public API. This measures the public alternative in the same
place: one tracker for the worker's life (memray's ALL_ALLOCATIONS file, as the
session writes), markers around each task as the session puts them, and after each
task ``memray.FileReader`` opened on the live capture, its allocation records read up
to the task's end marker (the heap peak between the markers, as memray computes it)
and its memory snapshots (the 10 ms heap/RSS samples). FileReader has no way to
resume where it stopped, so every task reads the capture from its start; what the
reader allocates while reading is tracked into the same capture.

    .venv/bin/python benchmarks/bench_memray_public.py            # 6 tasks, ~1 min
    .venv/bin/python benchmarks/bench_memray_public.py --tasks 4

Prints, per task: the read's wall time, the capture's records at that point, and
whether the task's end marker was found (a read that stops where memray is writing
misses it). Compare with bench_memory.py's fixed cost per task (the C reader).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import ray

MARKER = 12_345


@ray.remote(num_cpus=1)
class Worker:
    """A Ray worker with one memray tracker for its life, as level 2's session."""

    def __init__(self) -> None:
        import memray

        self.path = f"/dev/shm/tracer-bench-public-{os.getpid()}.bin"
        if os.path.exists(self.path):
            os.remove(self.path)
        self.tracker = memray.Tracker(
            destination=memray.FileDestination(self.path, overwrite=True, compress_on_exit=False),
            memory_interval_ms=10,
            file_format=memray.FileFormat.ALL_ALLOCATIONS,
        )
        self.tracker.__enter__()

    def task(self, alloc: int) -> dict[str, Any]:
        """An empty task (or one allocating ``alloc`` bytes) measured with FileReader."""
        import memray

        from tracer.ray import _memray_reader

        start = _memray_reader.marker_alloc(MARKER)
        if alloc:
            block = bytearray(alloc)
            del block
        end = _memray_reader.marker_alloc(MARKER)
        t0 = time.perf_counter()
        reader = memray.FileReader(self.path, report_progress=False)
        records = 0
        found = False
        in_task = False
        heap = peak = 0
        live: dict[int, int] = {}
        for record in reader.get_allocation_records():
            records += 1
            if record.size == MARKER and record.address == start:
                in_task = True
            elif in_task and record.size == MARKER and record.address == end:
                found = True
                break
            elif in_task and record.size:
                live[record.address] = record.size
                heap += record.size
                peak = max(peak, heap)
            elif in_task:
                heap -= live.pop(record.address, 0)
        samples = sum(1 for _ in reader.get_memory_snapshots())
        reader.close()
        read_s = time.perf_counter() - t0
        _memray_reader.marker_free(start)
        _memray_reader.marker_free(end)
        return {"read_s": read_s, "records": records, "found": found, "peak": peak,
                "samples": samples}

    def stop(self) -> None:
        self.tracker.__exit__(None, None, None)
        os.remove(self.path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per task")
    args = parser.parse_args()
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=78643200)
    worker = Worker.remote()  # type: ignore[attr-defined]
    print("task  read (FileReader, from the start)  records in the capture  end marker  peak")
    try:
        for i in range(args.tasks):
            alloc = 1 << 20 if i % 2 == 0 else 0
            r = ray.get(worker.task.remote(alloc), timeout=args.timeout)
            print(f"{i:>4}  {r['read_s'] * 1e3:>10.1f} ms  {r['records']:>22,}  "
                  f"{'found' if r['found'] else 'MISSED':>10}  {r['peak']:,} (allocated {alloc:,})")
        ray.get(worker.stop.remote())
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()

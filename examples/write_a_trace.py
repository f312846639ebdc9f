"""Write a small Perfetto trace with the format layer alone (no Ray needed).

    python examples/write_a_trace.py [--out PATH]

Prints where the trace is; open it at https://ui.perfetto.dev.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tracer.errors import TraceWriteError
from tracer.format import TraceWriter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path(tempfile.gettempdir()) / "example.perfetto-trace",
        help="the trace file, or a folder to write example.perfetto-trace in",
    )
    args = parser.parse_args()
    if args.out.is_dir():
        args.out = args.out / "example.perfetto-trace"  # a folder: the trace goes in it

    try:
        write(args.out)
    except TraceWriteError as exc:  # a folder that does not exist, no permission, disk full
        parser.exit(1, f"write_a_trace.py: error: {exc}\n")
    print(f"trace written to {args.out}")
    print("open it at https://ui.perfetto.dev (Open trace file), or: tracer open", args.out)


def write(out: Path) -> None:
    """Three waves of four tasks on a dispatch loop, with a tasks-in-flight counter."""
    with TraceWriter(out) as w:
        scheduler = w.process_track(1, "Scheduler", rank=0)
        loop = w.thread_track(1, 1, "dispatch loop")
        inflight = w.counter_track("tasks in flight", parent=scheduler)
        tasks = w.track("Tasks", child_ordering="chronological")
        for wave in range(3):
            w.begin(loop, f"wave {wave}", category="scheduler", args={"wave": wave})
            lanes = [w.track("task", parent=tasks) for _ in range(4)]
            for i, lane in enumerate(lanes):
                w.begin(lane, "task", category="task", args={"task_id": f"{wave}-{i}"})
            w.counter(inflight, len(lanes))
            time.sleep(0.01)
            for lane in lanes:
                w.end(lane)
            w.counter(inflight, 0)
            w.end(loop)


if __name__ == "__main__":
    main()

"""``tracer convert`` on a real Ray timeline: size, time and memory.

Run by hand (it is not a test), from the project root:

    .venv/bin/python benchmarks/bench_convert.py --tasks 10000
    .venv/bin/python benchmarks/bench_convert.py --tasks 10000 --copies 30   # ~0.5-1 GB

It runs ``--tasks`` no-op tasks on a local Ray, writes ``ray.timeline()``,
converts it and prints both sizes (target: the trace at least 5x smaller
than the JSON for 10k tasks), the conversion's time and its peak RSS (in a
subprocess). ``--copies N`` converts, in addition, a JSON made of N copies
of the timeline shifted in time, to show that memory does not grow with the
file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_RATIO = 5.0

_MEASURE = """
import resource, sys, time
from pathlib import Path
from tracer.cli.convert import convert
t0 = time.perf_counter()
stats = convert(Path(sys.argv[1]), Path(sys.argv[2]))
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      stats.tasks)
"""


def measure(src: Path, out: Path) -> tuple[float, int, int]:
    result = subprocess.run([sys.executable, "-c", _MEASURE, str(src), str(out)],
                            capture_output=True, text=True, check=True)
    seconds, rss, tasks = result.stdout.split()
    return float(seconds), int(rss), int(tasks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--copies", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * 1024 * 1024)

    @ray.remote
    def noop(x: int) -> int:
        return x

    ok = True
    with tempfile.TemporaryDirectory(prefix="bench_convert.") as tmp:
        folder = Path(tmp)
        for start in range(0, args.tasks, 1000):
            ray.get([noop.remote(i) for i in range(start, min(args.tasks, start + 1000))])
        src = folder / "timeline.json"
        ray.timeline(str(src))
        ray.shutdown()
        out = folder / "timeline.perfetto-trace"
        seconds, rss, tasks = measure(src, out)
        ratio = src.stat().st_size / out.stat().st_size
        print(f"{args.tasks} tasks: JSON {src.stat().st_size / 1e6:.1f} MB -> trace "
              f"{out.stat().st_size / 1e6:.2f} MB ({ratio:.1f}x smaller), {tasks} task slices, "
              f"{seconds:.1f} s, peak RSS {rss / 2**20:.0f} MiB")
        ok = ratio >= TARGET_RATIO
        if args.copies:
            events = json.loads(src.read_text())
            span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events) + 1
            big = folder / "big.json"
            with big.open("w") as f:
                f.write("[")
                for c in range(args.copies):
                    f.write(",".join(json.dumps(dict(e, ts=e["ts"] + c * span)) for e in events))
                    f.write("," if c < args.copies - 1 else "")
                f.write("]")
            t0 = time.perf_counter()
            seconds, rss, tasks = measure(big, folder / "big.perfetto-trace")
            print(f"{args.copies} copies: JSON {big.stat().st_size / 1e6:.0f} MB -> trace "
                  f"{(folder / 'big.perfetto-trace').stat().st_size / 1e6:.1f} MB, "
                  f"{tasks} task slices, {seconds:.1f} s, peak RSS {rss / 2**20:.0f} MiB "
                  f"({time.perf_counter() - t0:.1f} s with the subprocess)")
    print(f"{'PASS' if ok else 'FAIL'}  trace at least {TARGET_RATIO:.0f}x smaller: {ratio:.1f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

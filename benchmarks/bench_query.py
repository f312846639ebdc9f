"""Answers at scale: `tracer summary` on a run of N tasks, reader engine vs trace_processor.

Run by hand (it is not a test), from the project root, with a trace_processor binary:

    TRACE_PROCESSOR_PATH=../shared/bin/trace_processor_shell \\
        .venv/bin/python benchmarks/bench_query.py                  # 1M tasks, ~25 min
    .venv/bin/python benchmarks/bench_query.py --tasks 100000 --repeats 3   # a quick look

It writes a level-1 trace of ``--tasks`` tasks through the real RunnerTracer
with a fake clock and no Ray (benchmarks/simulated_run.py: the reference
runner's calls, two map stages, one node of two workers), then measures, in
fresh child processes:

* trace_processor loading the trace (``trace_processor_shell -Q "SELECT
  COUNT(*) FROM slice"``): wall time and peak RSS;
* ``tracer summary TRACE --engine reader --json`` and ``--engine
  trace_processor --json``: wall time, CPU time and peak RSS of the process
  doing the work (for trace_processor, the Python process and its
  trace_processor child together: their RSS is sampled every 20 ms and
  summed, their CPU times added). CPU time is shown because wall time on
  a loaded machine says more about the other jobs than about this one.

The engines alternate in every repetition (``--repeats``, default 3; the
order swaps each time) and the medians are compared, with the spread
(min-max) beside them: the machine is shared and noisy. Both engines'
answers must be equal. The target: the reader within 2x of trace_processor's
time and memory for ``summary``; the script exits 1 if it is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from simulated_run import write_run  # noqa: E402

MIB = 1 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE")
TARGET = 2.0


# ----------------------------------------------------------------- measuring


def _tree(pid: int) -> list[int]:
    """pid and its descendants (from /proc/<pid>/task/*/children)."""
    out = [pid]
    i = 0
    while i < len(out):
        try:
            for task in os.listdir(f"/proc/{out[i]}/task"):
                with open(f"/proc/{out[i]}/task/{task}/children") as f:
                    out.extend(int(c) for c in f.read().split())
        except OSError:
            pass
        i += 1
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class Run:
    """A child process: its wall time, CPU time (user + system, its children included)
    and the peak of its process tree's summed RSS, sampled every 20 ms."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.env = env
        self.peak = 0
        self.wall = 0.0
        self.cpu = 0.0
        self.stdout = ""
        self.stderr = ""

    def run(self) -> Run:
        with tempfile.TemporaryFile() as out:
            start = time.perf_counter()
            proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.PIPE, env=self.env, cwd=ROOT
            )
            done = threading.Event()

            def sample() -> None:
                while not done.is_set():
                    total = sum(_rss(p) for p in _tree(proc.pid))
                    self.peak = max(self.peak, total)
                    done.wait(0.02)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            _, status, usage = os.wait4(proc.pid, 0)
            self.wall = time.perf_counter() - start
            done.set()
            sampler.join()
            self.stderr = proc.stderr.read().decode() if proc.stderr else ""
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode != 0:
                raise SystemExit(
                    f"{' '.join(self.argv)} failed ({proc.returncode}):\n{self.stderr}"
                )
            self.cpu = usage.ru_utime + usage.ru_stime
            for line in self.stderr.splitlines():  # summary_argv's own count, children included
                if line.startswith("CPU "):
                    self.cpu = float(line.split()[1])
            out.seek(0)
            self.stdout = out.read().decode()
        return self


def summary_argv(trace: Path, engine: str) -> list[str]:
    """`tracer summary TRACE --engine ENGINE --json`, which then prints on stderr the CPU
    time of its process and its children (trace_processor, reaped when it is closed)."""
    code = (
        "import resource, sys\n"
        "from tracer.cli import main\n"
        "status = main(sys.argv[1:])\n"
        "s = resource.getrusage(resource.RUSAGE_SELF)\n"
        "c = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(f'CPU {s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime}', file=sys.stderr)\n"
        "sys.exit(status)\n"
    )
    return [sys.executable, "-c", code, "summary", str(trace), "--engine", engine, "--json"]


# ------------------------------------------------------------------- main


def fmt_s(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} s  ({min(values):.1f}-{max(values):.1f})"


def fmt_mib(values: list[float]) -> str:
    return (f"{statistics.median(values) / MIB:7.0f} MiB ({min(values) / MIB:.0f}-"
            f"{max(values) / MIB:.0f})")


def same_answers(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def close(x: Any, y: Any) -> bool:
        if isinstance(x, float) or isinstance(y, float):
            return x == y or (x is not None and y is not None and abs(x - y) <= 1e-9 * abs(y))
        if isinstance(x, dict) and isinstance(y, dict):
            return x.keys() == y.keys() and all(close(x[k], y[k]) for k in x)
        if isinstance(x, list) and isinstance(y, list):
            return len(x) == len(y) and all(close(p, q) for p, q in zip(x, y, strict=True))
        return bool(x == y)

    keys = ("run", "stages", "latency_by_stage", "dispatch_loop", "worker_utilisation")
    return all(close(a[k], b[k]) for k in keys)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trace", type=Path, help="use this trace instead of writing one")
    parser.add_argument("--keep", type=Path, help="write the trace here and keep it")
    args = parser.parse_args()

    from tracer.query import TraceProcessorNotFoundError, find_trace_processor

    try:
        tp = find_trace_processor()
    except TraceProcessorNotFoundError as exc:
        print(f"bench_query: {exc}", file=sys.stderr)
        return 2
    os.environ["TRACE_PROCESSOR_PATH"] = tp  # for the summaries
    version = subprocess.run([tp, "--version"], capture_output=True, text=True).stdout
    print(f"trace_processor: {tp} ({version.splitlines()[0] if version else '?'})")
    folder = tempfile.TemporaryDirectory()
    if args.trace is not None:
        trace = args.trace
        print(f"trace: {trace} (given)")
    else:
        trace = args.keep or Path(folder.name) / "run.perfetto-trace"
        start = time.perf_counter()
        write_run(trace, args.tasks)
        print(f"trace: {args.tasks} tasks written in {time.perf_counter() - start:.0f} s")
    size = trace.stat().st_size
    print(f"trace size: {size / MIB:.1f} MiB ({size / args.tasks:.0f} bytes per task)")

    load = [Run([tp, "-Q", "SELECT COUNT(*) AS slices FROM slice", str(trace)]).run()
            for _ in range(args.repeats)]
    slices = load[-1].stdout.split()[-1]
    print(f"trace_processor loads it: {fmt_s([r.wall for r in load])}, "
          f"peak RSS {fmt_mib([r.peak for r in load])}; {slices} slices")

    runs: dict[str, list[Run]] = {"reader": [], "trace_processor": []}
    answers: dict[str, dict[str, Any]] = {}
    for i in range(args.repeats):
        order = ["reader", "trace_processor"] if i % 2 == 0 else ["trace_processor", "reader"]
        for engine in order:
            run = Run(summary_argv(trace, engine)).run()
            runs[engine].append(run)
            answers[engine] = json.loads(run.stdout)
            print(f"  run {i + 1}: {engine:15} {run.wall:7.1f} s wall, {run.cpu:7.1f} s CPU, "
                  f"peak RSS {run.peak / MIB:6.0f} MiB", flush=True)
    same = same_answers(answers["reader"], answers["trace_processor"])

    print(f"\n`tracer summary` on {args.tasks} tasks, medians of {args.repeats} "
          "(min-max); memory: peak RSS of the process tree")
    print(f"{'engine':16} {'wall':>24} {'CPU':>24} {'peak memory':>26}")
    for engine, rs in runs.items():
        print(f"{engine:16} {fmt_s([r.wall for r in rs]):>24} {fmt_s([r.cpu for r in rs]):>24} "
              f"{fmt_mib([r.peak for r in rs]):>26}")

    def ratio(key: str) -> float:
        return float(statistics.median(getattr(r, key) for r in runs["reader"])
                     / statistics.median(getattr(r, key) for r in runs["trace_processor"]))

    wall, cpu, memory = ratio("wall"), ratio("cpu"), ratio("peak")
    met = wall <= TARGET and memory <= TARGET
    ok = met and same
    print(f"\nreader / trace_processor: wall time {wall:.2f}x (CPU time {cpu:.2f}x), "
          f"memory {memory:.2f}x (target <= {TARGET:.0f}x): {'PASS' if met else 'FAIL'}")
    print(f"same answers from both engines: {'yes' if same else 'NO'}")
    folder.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())

"""CPU meters for the benchmarks: a process, a process and everything under it, the
machine; and a background load that keeps the cores busy.

Linux only (/proc). Shared by bench_runner.py and bench_level1.py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

__all__ = [
    "KINDS", "busy_load", "load_pids", "machine_busy_s", "proc_cpu_s", "tree_cpu_by_kind",
    "tree_cpu_s",
]

_TICK = os.sysconf("SC_CLK_TCK")
#: The --busy load's processes, whose CPU is not the run's.
_LOAD_PIDS: list[int] = []


def _proc_stat(pid: int | str) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and its reaped children) from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        return int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICK
    except (ValueError, IndexError):
        return None


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of one process."""
    stat = _proc_stat(pid)
    return 0.0 if stat is None else stat[1]


def _tree(root: int) -> Iterator[tuple[int, float]]:
    """(pid, CPU seconds) of ``root`` and every process under it, the load's left out."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _proc_stat(entry)
            if stat is not None:
                stats[int(entry)] = stat
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            yield pid, stats[pid][1]
        todo.extend(p for p in children.get(pid, ()) if p not in _LOAD_PIDS)


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds of ``root`` (this process) and every process under it.

    A local ``ray.init`` starts the GCS and the raylet as the driver's
    children and the raylet starts the workers: this is the run's CPU across
    all of its processes, without what other users of a shared machine spend
    (the machine's total, ``all processes``, has it). Workers are kept alive
    by the benchmark, so none exits with its CPU uncounted.
    """
    return sum(cpu for _, cpu in _tree(os.getpid() if root is None else root))


#: The kinds :func:`tree_cpu_by_kind` splits the run's CPU into, in the order printed.
KINDS = ("driver: main thread", "driver: other threads", "workers", "raylet", "gcs_server",
         "other")


def tree_cpu_by_kind() -> dict[str, float]:
    """:func:`tree_cpu_s` of this process, split by who spent it (``KINDS``).

    Why: a variant's extra CPU means different things where it lands. The
    dispatch loop's thread slows the run; the driver's other threads are
    Ray's (gRPC, its event buffer) and the tracer's (flushes, reading and
    drawing Ray's events, finished threads included); a worker's is the
    task's own path (the measurement, an extra return value); the GCS's is
    what Ray's events cost it to store and send.
    """
    me = os.getpid()
    out = dict.fromkeys(KINDS, 0.0)
    for pid, cpu in _tree(me):
        if pid == me:
            main = _proc_stat(f"self/task/{me}")
            main_s = 0.0 if main is None else main[1]
            out["driver: main thread"] += main_s
            out["driver: other threads"] += cpu - main_s
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # gone since: its CPU still counts, as tree_cpu_s's does
            comm = ""
        kind = "workers" if comm.startswith("ray::") else comm
        out[kind if kind in out else "other"] += cpu
    return out


@contextlib.contextmanager
def busy_load(n: int) -> Iterator[list[int]]:
    """``n`` processes spinning on the CPU (the cores kept busy by other work)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)
    ]
    _LOAD_PIDS[:] = [p.pid for p in procs]
    try:
        yield list(_LOAD_PIDS)
    finally:
        _LOAD_PIDS.clear()
        for p in procs:
            p.kill()
            p.wait()


def machine_busy_s() -> float:
    """CPU seconds all processes spent so far (Linux /proc/stat; nan elsewhere)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def load_pids() -> list[int]:
    """The processes of the busy_load running now."""
    return list(_LOAD_PIDS)

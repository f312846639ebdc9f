"""Level 2 in a real Ray worker: one memray tracker for the process, and its lifetime.

Each test runs its steps inside one actor (a Ray worker process, reused from
step to step as a worker is across tasks), calling module-level functions of
this file there.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray

from tracer.ray import memory, memory_session
from tracer.ray.task_metrics import TaskContext, measure_task

pytestmark = pytest.mark.usefixtures("ray_local")

MIB = 1 << 20
MS = 1_000_000
#: Ray's own threads allocate during a task too (as in test_memory_ray).
SLACK = MIB


@ray.remote
class Worker:
    """A Ray worker process that runs the test's steps one after the other."""

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


@pytest.fixture
def worker() -> Iterator[Any]:
    actor = Worker.remote()  # type: ignore[attr-defined]
    yield actor
    ray.kill(actor)


def _in(worker: Any, fn: Callable[..., Any], *args: Any) -> Any:
    return ray.get(worker.run.remote(fn, *args), timeout=120)


# ------------------------------------------------------------ in the worker


def _task(hold_mib: int = 0, keep_mib: int = 0, level: int = 2, **ctx: Any) -> dict[str, Any]:
    """One measured task: ``hold_mib`` allocated for 100 ms then freed, ``keep_mib`` kept.

    (100 ms: memray snapshots every 10 ms, but on a loaded machine its thread waits.)
    """
    with measure_task(TaskContext("exec", "t", 0, level, **ctx)) as metrics:
        held = bytes(hold_mib * MIB)
        if hold_mib:
            time.sleep(0.1)
        del held
        kept = bytes(keep_mib * MIB)
    metrics["_kept"] = len(kept)
    return metrics


def _session_id() -> int | None:
    session = memory_session._session
    return None if session is None else id(session.tracker)


def _tracker_is_free() -> bool:
    """No memray tracker is active in this process: a new one starts."""
    import memray

    path = os.path.join(memory._capture_dir(), f"probe-{os.getpid()}.bin")
    try:
        with memray.Tracker(
            destination=memray.FileDestination(path, overwrite=True, compress_on_exit=False)
        ):
            pass
    except RuntimeError:
        return False
    finally:
        memory._remove(path)
    return True


def _many_tasks(n: int) -> list[tuple[int | None, dict[str, Any]]]:
    return [(_session_id(), _task(hold_mib=i % 3, keep_mib=1)) for i in range(n)]


def _my_capture_files() -> list[str]:
    directory = memory._capture_dir()
    prefix = f"{memory._CAPTURE_PREFIX}{os.getpid()}-"
    return [name for name in os.listdir(directory) if name.startswith(prefix)]


def _capture_fds() -> list[str]:
    """The open files of this process that are memray captures of ours (unlinked)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if memory._CAPTURE_PREFIX in target:
            found.append(target)
    return found


# ------------------------------------------------------------------- tests


def test_one_tracker_measures_every_task(worker: Any) -> None:
    results = _in(worker, _many_tasks, 30)
    sessions = {session for session, _ in results[1:]}
    assert len(sessions) == 1 and None not in sessions  # started once, kept
    seen = []
    for i, (_, m) in enumerate(results):
        assert "memray" not in m, m
        hold = (i % 3) * MIB
        assert max(hold, MIB) <= m["heap_peak"] <= hold + MIB + SLACK, (i, m["heap_peak"])
        assert MIB <= m["heap_retained"] <= MIB + SLACK
        assert m["allocations"] >= 1 and m["start_ns"] < m["end_ns"]
        samples = m.get("memory_samples", [])
        assert all(heap <= m["heap_peak"] for _, heap, _ in samples)
        if hold:  # held 100 ms: memray's 10 ms snapshots saw it
            seen.append(max((heap for _, heap, _ in samples), default=0) >= hold)
    # (memray's snapshot thread can be kept waiting on a loaded machine: nearly all.)
    assert sum(seen) >= len(seen) - 2, seen
    assert _in(worker, _session_id) is not None
    assert _in(worker, _my_capture_files) == []  # unlinked: lives in the open file only
    assert len(set(_in(worker, _capture_fds))) == 1  # memray's and the reader's


def test_the_tracker_stops_when_idle_and_starts_again(worker: Any) -> None:
    _in(worker, _task, 1)
    assert _in(worker, _session_id) is not None
    assert _in(worker, _tracker_is_free) is False
    time.sleep(memory_session.IDLE_SECONDS * 2 + 0.5)
    assert _in(worker, _session_id) is None
    assert _in(worker, _tracker_is_free) is True  # untraced tasks are not tracked any more
    assert _in(worker, _capture_fds) == []
    # Level 1 after level 2, then level 2 again: measured, with a new tracker.
    level1 = _in(worker, _task, 4, 0, 1)
    assert "heap_peak" not in level1 and level1["rss_peak"] > 0
    again = _in(worker, _task, 4)
    assert "memray" not in again and again["heap_peak"] >= 4 * MIB


def test_both_methods_give_the_same_figures(worker: Any) -> None:
    def run(per_task: bool) -> dict[str, Any]:
        return _in(worker, _task_with_method, per_task)

    session = [run(False) for _ in range(3)]
    per_task = [run(True) for _ in range(3)]
    for m in session:
        assert "memray" not in m, m
    for m in per_task:  # said (the trace and the summary count them), with why
        assert m["memray"] == memory.MEMRAY_PER_TASK, m
        assert memory_session.PER_TASK_ENV in m["memray_reason"], m
    for m in session + per_task:
        assert 24 * MIB <= m["heap_peak"] <= 24 * MIB + SLACK
        assert 8 * MIB <= m["heap_retained"] <= 8 * MIB + SLACK
    # The session's samples are memray's snapshots of the task, like a tracker's of its own.
    assert all(len(m["memory_samples"]) >= 3 for m in session + per_task)


def _task_with_method(per_task: bool) -> dict[str, Any]:
    if per_task:
        os.environ[memory_session.PER_TASK_ENV] = "1"
    try:
        with measure_task(TaskContext("exec", "t", 0, 2)) as metrics:
            kept = bytes(8 * MIB)
            transient = bytes(16 * MIB)
            time.sleep(0.1)
            del transient
        metrics["_session"] = _session_id()
    finally:
        os.environ.pop(memory_session.PER_TASK_ENV, None)
    metrics["_kept"] = len(kept)
    return metrics


def _spike(per_task: bool) -> dict[str, Any]:
    """24 MiB allocated and freed at once: between two of memray's snapshots, unless the
    thread is preempted in between (then a snapshot may show it)."""
    if per_task:
        os.environ[memory_session.PER_TASK_ENV] = "1"
    try:
        with measure_task(TaskContext("exec", "t", 0, 2)) as metrics:
            time.sleep(0.05)
            metrics["_spike_ns"] = time.time_ns()
            spike = bytearray(24 * MIB)
            del spike
            metrics["_freed_ns"] = time.time_ns()
            time.sleep(0.05)
    finally:
        os.environ.pop(memory_session.PER_TASK_ENV, None)
    return metrics


@pytest.mark.parametrize("per_task", [False, True], ids=["session", "per-task"])
def test_a_peak_between_snapshots_is_placed_in_its_gap(worker: Any, per_task: bool) -> None:
    """The worker's heap counter gets a sample of it there (timeline/memory.py)."""
    for _ in range(3):
        m = _in(worker, _spike, per_task)
        assert m.get("memray") == (memory.MEMRAY_PER_TASK if per_task else None), m
        assert 24 * MIB <= m["heap_peak"] <= 24 * MIB + SLACK
        at = m.get("heap_peak_at_ns")
        samples = m["memory_samples"]
        if max(heap for _, heap, _ in samples) >= m["heap_peak"]:
            assert at is None  # a snapshot has the peak itself: the counter has it
            continue
        assert at is not None and m["start_ns"] <= at <= m["end_ns"]
        if per_task:  # memray's reader does not say when: the task's middle
            assert at == (m["start_ns"] + m["end_ns"]) // 2
            continue
        # The peak was reached between the allocation and the free: no snapshot lies
        # between that and where it was placed (memray's times are whole ms: 1 ms slack).
        lo, hi = m["_spike_ns"], m["_freed_ns"]
        if at < lo:
            lo, hi = at, lo
        elif at > hi:
            lo, hi = hi, at
        else:
            continue
        between = [t for t, _, _ in samples if lo + MS < t * MS < hi - MS]
        assert not between, (at, m["_spike_ns"], m["_freed_ns"], samples)


def test_a_forked_child_leaves_the_parent_measured(worker: Any) -> None:
    assert "memray" not in _in(worker, _task, 2)
    child = _in(worker, _fork_and_measure)
    assert child["exit"] == 0, child  # the child's task ran to its end
    report = json.loads(child["report"])
    # memray cannot start a tracker in the child of a tracked process (its thread
    # patches are inherited): the child's task is measured at level 1, with the reason.
    assert report["heap_peak"] is not None or report["memray_reason"], report
    after = _in(worker, _task, 3, 1)
    assert "memray" not in after, after
    assert 3 * MIB <= after["heap_peak"] <= 3 * MIB + SLACK
    assert MIB <= after["heap_retained"] <= MIB + SLACK


def _fork_and_measure() -> dict[str, Any]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure one task, report, exit without cleanup
        status = 1
        try:
            m = _task(1)
            fields = ("heap_peak", "memray", "memray_reason")
            os.write(write, json.dumps({k: m.get(k) for k in fields}).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as f:
        report = f.read()
    _, status = os.waitpid(pid, 0)
    return {"exit": os.waitstatus_to_exitcode(status), "report": report}


def test_a_killed_worker_leaves_no_capture_behind(worker: Any) -> None:
    _in(worker, _task, 1)
    pid = ray.get(worker.run.remote(os.getpid))
    assert _in(worker, _capture_fds)
    before = set(os.listdir(memory._capture_dir()))
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    prefix = f"{memory._CAPTURE_PREFIX}{pid}-"
    assert not [n for n in os.listdir(memory._capture_dir()) if n.startswith(prefix)]
    assert not [n for n in before if n.startswith(prefix)]


def test_a_tracker_that_fails_to_start_degrades_the_task(worker: Any) -> None:
    failed, after = _in(worker, _with_broken_tracker)
    assert failed["memray"] == memory.MEMRAY_UNAVAILABLE
    assert "broken tracker" in failed["memray_reason"] and "heap_peak" not in failed
    assert failed["rss_peak"] > 0
    assert "memray" not in after and after["heap_peak"] >= 2 * MIB


def _with_broken_tracker() -> tuple[dict[str, Any], dict[str, Any]]:
    import memray

    memory_session.stop()
    real = memray.Tracker

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("broken tracker")

    memray.Tracker = broken
    try:
        failed = _task(2)
    finally:
        memray.Tracker = real
    return failed, _task(2)


def test_a_worker_without_memray_measures_at_level_one(worker: Any) -> None:
    without, after = _in(worker, _without_memray)
    assert without["memray"] == memory.MEMRAY_UNAVAILABLE
    assert "memray" in without["memray_reason"] and "heap_peak" not in without
    assert without["rss_peak"] > 0 and without["_kept"] == 0
    assert "memray" not in after and after["heap_peak"] >= 2 * MIB


def _without_memray() -> tuple[dict[str, Any], dict[str, Any]]:
    import sys

    memory_session.stop()
    saved = {name: module for name, module in sys.modules.items() if name.startswith("memray")}
    for name in saved:
        del sys.modules[name]
    sys.modules["memray"] = None  # type: ignore[assignment]  # import memray: ImportError
    try:
        without = _task(2)
    finally:
        del sys.modules["memray"]
        sys.modules.update(saved)
    return without, _task(2)


def test_an_unreadable_capture_falls_back_to_a_tracker_per_task(worker: Any) -> None:
    results, reason, session, said = _in(worker, _with_unknown_capture_version)
    assert "version 99" in (reason or "")
    assert session is None
    # Said once in the worker (Ray shows it on the driver's console), with why: the slower
    # way was invisible but for its speed.
    assert len([m for m in said if "a memray tracker of its own" in m]) == 1, said
    assert "version 99" in said[0]
    for m in results:  # measured all the same, by a tracker around each task, said so
        assert m["memray"] == memory.MEMRAY_PER_TASK and "version 99" in m["memray_reason"]
        assert 2 * MIB <= m["heap_peak"] <= 2 * MIB + SLACK


def _with_unknown_capture_version() -> tuple[
    list[dict[str, Any]], str | None, int | None, list[str]
]:
    import logging

    import tracer.ray._memray_reader as reader_module

    memory_session.stop()
    real = reader_module.Reader
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    def refuse(fd: int) -> Any:
        raise ValueError("memray capture version 99 (this reader knows 13)")

    reader_module.Reader = refuse  # type: ignore[misc]
    keep = Keep()
    logging.getLogger("tracer").addHandler(keep)
    try:
        results = [_task(2) for _ in range(3)]
        return results, memory_session.disabled_reason(), _session_id(), said
    finally:
        logging.getLogger("tracer").removeHandler(keep)
        reader_module.Reader = real  # type: ignore[misc]
        memory_session._disabled = None


def test_an_unknown_memray_release_falls_back_to_a_tracker_per_task(worker: Any) -> None:
    """A memray the reader was not checked against is not read live, whatever its header says."""
    results, reason, session = _in(worker, _with_memray_version, "1.99.0")
    assert reason is not None and "memray 1.99.0" in reason
    assert session is None
    for m in results:  # memray's public API around each task: the same figures
        assert m["memray"] == memory.MEMRAY_PER_TASK and "1.99.0" in m["memray_reason"]
        assert 2 * MIB <= m["heap_peak"] <= 2 * MIB + SLACK
    results, reason, session = _in(worker, _with_memray_version, None)  # the real one: live
    assert reason is None and session is not None
    assert all(2 * MIB <= m["heap_peak"] <= 2 * MIB + SLACK for m in results)


def test_the_known_memray_releases() -> None:
    import memray

    assert memory_session._check_memray(memray.__version__) is None  # the installed one
    assert memory_session._check_memray("1.20.3") is None
    for other in ("1.21.0", "2.0", "1.19.1", "", "dev"):
        reason = memory_session._check_memray(other) or ""
        assert "live capture reader knows memray 1.20" in reason


def _with_memray_version(
    version: str | None,
) -> tuple[list[dict[str, Any]], str | None, int | None]:
    import memray

    memory_session.stop()
    real = memray.__version__
    if version is not None:
        memray.__version__ = version
    try:
        results = [_task(2) for _ in range(3)]
        return results, memory_session.disabled_reason(), _session_id()
    finally:
        memray.__version__ = real
        memory_session._disabled = None


def test_the_per_task_switch_stops_the_session(worker: Any) -> None:
    assert "memray" not in _in(worker, _task, 1)
    m = _in(worker, _task_with_method, True)
    assert m["memray"] == memory.MEMRAY_PER_TASK and m["_session"] is None
    assert m["heap_peak"] >= 24 * MIB


def test_a_long_task_is_read_while_it_runs(worker: Any) -> None:
    m, offsets = _in(worker, _long_task)
    assert "memray" not in m, m
    # The watcher read the capture (and released it) while the task ran...
    assert offsets[-1] > offsets[0], offsets
    # ... and added nothing to the task's figures: 20k blocks of 600 bytes kept.
    kept = 20_000 * 600
    assert kept <= m["heap_retained"] <= kept + MIB
    assert kept <= m["heap_peak"] <= kept + MIB
    assert m["allocation_count"] >= 60_000


def _long_task() -> tuple[dict[str, Any], list[int]]:
    _task()  # the session is up
    session = memory_session._session
    assert session is not None
    offsets = []
    ctx = TaskContext("exec", "t", 0, 2, memray_all_allocations=True)
    with measure_task(ctx) as metrics:
        kept = []
        deadline = time.monotonic() + memory_session.WATCH_SECONDS * 3
        while time.monotonic() < deadline or len(kept) < 20_000:
            for _ in range(1000):
                bytearray(600)  # allocated and freed
            if len(kept) < 20_000:
                kept += [bytes(600 - 33) for _ in range(1000)]  # one 600-byte malloc each
            offsets.append(session.reader.offset)
            time.sleep(0.01)
    return metrics, offsets

"""Tracing never breaks the job: crashes and write failures degrade the trace, not the run.

Real Ray, real files: a driver killed with SIGKILL, a full disk (a tiny tmpfs
and /dev/full), the output folder removed mid-run, permission denied.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from engines_agree import assert_engines_agree

from tracer.format import read_trace
from tracer.ray import layout as L
from tracer.runner import Pipeline, Stage

pytestmark = pytest.mark.usefixtures("ray_local")


def _slow(x: int) -> int:
    time.sleep(0.02)
    return x * 2


def _pipeline(n: int = 40) -> Pipeline:
    return Pipeline(list(range(n)), [Stage("slow", _slow), Stage("inc", lambda x: x + 1)])


def _expected(n: int = 40) -> list[int]:
    return [x * 2 + 1 for x in range(n)]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records
        if r.name == "tracer" and r.levelno == logging.WARNING
    ]


def test_a_device_as_the_trace_path_runs_untraced(caplog: pytest.LogCaptureFixture) -> None:
    """/dev/full (whose every write fails) is refused before any write: not a regular file."""
    caplog.set_level(logging.WARNING, logger="tracer")
    results = _pipeline().run(tracing_level=1, trace_path="/dev/full")
    assert results == _expected()
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "running untraced" in warnings[0] and "/dev/full" in warnings[0]


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: fills up a few waves into a traced run."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs to fill a disk needs root and mount(8)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_at_the_first_write_runs_untraced(
    tiny_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A disk with no room left: the trace file is created, its first write fails."""
    caplog.set_level(logging.WARNING, logger="tracer")
    fd = os.open(tiny_disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        with contextlib.suppress(OSError):  # ENOSPC: full
            while os.write(fd, b"\0" * 4096):
                pass
    finally:
        os.close(fd)
    path = tiny_disk / "run.perfetto-trace"
    results = _pipeline().run(tracing_level=1, trace_path=path)
    assert results == _expected()
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert str(path) in warnings[0]
    assert "running untraced" in warnings[0] or "tracing stopped" in warnings[0]


def test_disk_full_mid_run_stops_tracing_once(
    tiny_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    path = tiny_disk / "run.perfetto-trace"
    n = 600  # ~2 tasks per partition, well over 64 KiB of trace
    stages = [Stage("double", lambda x: x * 2), Stage("inc", lambda x: x + 1)]
    pipeline = Pipeline(list(range(n)), stages)
    results = pipeline.run(tracing_level=1, trace_path=path)
    assert results == [x * 2 + 1 for x in range(n)]
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "tracing stopped" in warnings[0]
    # What was written before the disk filled up still reads.
    model = read_trace(path)
    assert any(s.name == L.SLICE_WAVE for s in model.slices)


def test_output_folder_removed_mid_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    out = tmp_path / "traces"
    out.mkdir()
    path = out / "run.perfetto-trace"

    def slow_then_remove(x: int) -> int:
        time.sleep(0.02)
        return x

    removed = {"done": False}

    def partitions() -> Iterator[int]:
        for i in range(60):
            if i == 20 and not removed["done"]:
                shutil.rmtree(out)
                removed["done"] = True
            yield i

    results = Pipeline(partitions(), [Stage("slow", slow_then_remove)]).run(
        tracing_level=1, trace_path=path
    )
    assert results == list(range(60))
    assert removed["done"]
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "removed" in warnings[0]


def test_permission_denied_runs_untraced(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    target = Path("/sys/tracer-test.perfetto-trace")  # sysfs refuses even root
    try:
        target.open("wb").close()
    except PermissionError:
        pass
    except OSError as exc:
        pytest.skip(f"no read-only /sys here ({exc})")
    else:
        target.unlink()
        pytest.skip("/sys is writable here: no path refuses root")
    results = _pipeline(10).run(tracing_level=1, trace_path=target)
    assert results == _expected(10)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "running untraced" in warnings[0], warnings


def test_missing_output_folder_runs_untraced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tracer")
    results = _pipeline(10).run(
        tracing_level=1, trace_path=tmp_path / "no" / "such" / "dir" / "t.perfetto-trace"
    )
    assert results == _expected(10)
    assert len(_warnings(caplog)) == 1


_DRIVER = textwrap.dedent(
    """
    import sys, time
    import ray
    from tracer.runner import Pipeline, Stage

    ray.init(address=sys.argv[1], log_to_driver=False)

    def slow(x):
        time.sleep(0.05)
        return x

    def partitions():
        for i in range(100000):
            yield i

    print("started", flush=True)
    Pipeline(partitions(), [Stage("slow", slow)]).run(tracing_level=1, trace_path=sys.argv[2])
    """
)


def test_sigkill_of_the_driver_leaves_a_trace_that_loads(tmp_path: Path) -> None:
    """Flushes at every wave end and every second: a killed driver loses at most ~1 s."""
    path = tmp_path / "killed.perfetto-trace"
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen(
        [sys.executable, str(script), address, str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"started"
        deadline = time.monotonic() + 60
        # Wait until several waves have been flushed, then kill mid-run.
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size > 8000:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the driver wrote no trace in 60 s")
        time.sleep(0.5)
        killed_at = time.time_ns()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    model = read_trace(path)
    waves = [s for s in model.slices if s.name == L.SLICE_WAVE]
    assert len(waves) >= 3
    closed = [s for s in waves if s.dur is not None]
    assert closed, "no complete wave survived"
    # Flushed at least every second: the last complete wave ended < ~2 s before the kill.
    last_end = max(s.ts + (s.dur or 0) for s in closed)
    assert killed_at - last_end < 2_500_000_000
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    assert executions, "no execution measurements made it into the trace"
    assert_engines_agree(path)

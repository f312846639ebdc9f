"""A write that falls short or fails (a full disk) leaves the trace as it was.

The README's promise: the file is a valid trace at every instant, and the
first error writing it raises :class:`TraceWriteError`. A full disk is played
here by ``RLIMIT_FSIZE`` in a subprocess (with ``SIGXFSZ`` ignored): a write
that reaches the limit writes what fits and returns a short count, and the
next one fails with ``EFBIG``. Whatever the write that falls short (a bundle
that grows the file over its raw tail, a bundle cut short over that tail, a
raw append), the file must still read, with every event flushed before it,
not be ``truncated``, and be exactly as long as before; the writer must stay
usable (a later write, once there is room again, lands after those events).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tp_check

from tracer.format import read_trace

FLUSHED = 200  # events made durable (flush) before the limit is set

_SCRIPT = r"""
import json, os, random, resource, signal, sys

from tracer.errors import TraceWriteError
from tracer.format import TraceWriter

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not a kill
cfg = json.loads(sys.argv[1])
path = cfg["path"]
w = TraceWriter(path, compress=cfg["compress"], buffer_size=cfg["buffer_size"])
loop = w.thread_track(pid=1, tid=1, name="loop")
n = 0
for _ in range(cfg["flushes"]):
    for _ in range(cfg["flushed"] // cfg["flushes"]):
        w.instant(loop, f"flushed-{n}", args={"i": n, "pad": "x" * 40})
        n += 1
    w.flush()
durable_size = os.path.getsize(path)
headroom = cfg.get("headroom")
limit = durable_size + headroom if headroom is not None else cfg["limit"]
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
rnd = random.Random(1)
error = None
try:
    for i in range(cfg["late"]):  # hardly compressible: a bundle of them outgrows the tail
        w.instant(loop, f"late-{i}", args={"r": "%032x" % rnd.getrandbits(128)})
    if cfg["then"] == "flush":
        w.flush()
    else:
        w.close()
except TraceWriteError as exc:
    error = str(exc)
size_after_error = os.path.getsize(path)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
for i in range(cfg["after"]):
    w.instant(loop, f"after-{i}")
w.close()
print(json.dumps({"durable_size": durable_size, "error": error,
                  "size_after_error": size_after_error}))
"""

_CASES: dict[str, dict[str, Any]] = {
    # At close, the bundle of the raw tail and 3000 new events is bigger than the
    # tail: its pwrite grows the file and reaches the limit part-way.
    "bundle-grows-at-close-no-room": dict(compress=True, headroom=0, then="close"),
    "bundle-grows-at-close-100-bytes": dict(compress=True, headroom=100, then="close"),
    "bundle-grows-at-close-5000-bytes": dict(compress=True, headroom=5000, then="close"),
    # The same mid-trace: the buffer fills (64 KiB), the event call that bundles
    # raises; once there is room again the writer goes on.
    "bundle-grows-mid-trace": dict(
        compress=True, buffer_size=64 * 1024, flushes=4, headroom=100, after=100,
    ),
    # A bundle smaller than the tail it replaces, its pwrite cut short at 10 bytes
    # (a limit below the file's size): without a check, ftruncate succeeds and the
    # file silently ends in a cut bundle.
    "bundle-cut-short-over-tail": dict(
        compress=True, buffer_size=1 << 20, flushes=10, limit=10, late=0, then="close",
    ),
    # Raw appends: uncompressed, and a compressed writer's durable flush (raw tail).
    "append-uncompressed": dict(compress=False, headroom=100, after=100),
    "append-raw-tail": dict(compress=True, buffer_size=1 << 20, headroom=100, after=100),
}


def run_case(path: Path, case: dict[str, Any]) -> dict[str, Any]:
    cfg = dict(
        path=str(path), flushed=FLUSHED, buffer_size=256 * 1024, flushes=1, late=3000,
        then="flush", after=0,
    )
    cfg.update(case)
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(cfg)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("name", list(_CASES))
def test_a_short_write_keeps_every_flushed_event(tmp_path: Path, name: str) -> None:
    case = _CASES[name]
    path = tmp_path / "t.perfetto-trace"
    result = run_case(path, case)

    assert result["error"] is not None, "the failed write raised no TraceWriteError"
    assert f"cannot write trace file {path}" in result["error"]
    # Right after the error the file is what it was: nothing cut off, nothing left over.
    assert result["size_after_error"] == result["durable_size"]

    model = read_trace(path, strict=True)
    assert not model.truncated
    names = [i.name for i in model.instants]
    flushed = [n for n in names if n.startswith("flushed-")]
    assert flushed == [f"flushed-{i}" for i in range(FLUSHED)]
    assert not [n for n in names if n.startswith("late-")]  # the chunk that failed is dropped
    after = case.get("after", 0)
    assert [n for n in names if n.startswith("after-")] == [f"after-{i}" for i in range(after)]

    bin_path = tp_check.find_binary()
    if bin_path is not None:  # (the suite's check runs it again after the test)
        assert tp_check.problems(path, bin_path, model) == []

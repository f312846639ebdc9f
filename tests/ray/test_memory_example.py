"""examples/big_task_heap_usage.py at level 2: inflate far above its request; the table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tracer.format import read_trace
from tracer.ray import layout as L

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "big_task_heap_usage.py"


def test_inflate_peak_far_above_its_request(tmp_path: Path) -> None:
    path = tmp_path / "big.perfetto-trace"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_AUTH_MODE"] = "disabled"
    env.pop("TRACER_ENABLE_RAY_TRACING", None)
    proc = subprocess.run(
        [
            sys.executable, str(EXAMPLE),
            "--num-partitions", "3", "--num-rows-per-partition", "5000",
            "--inflation-factor", "16", "--deflation-factor", "8",
            "--tracing-level", "2", "--trace-out", str(path),
        ],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]

    # The tables printed at the end: `tracer memory`'s, computed from the trace.
    assert "peak = memray's heap peak of the task (level 2" in out, out
    # id, stage, tasks, measured, requested, peak p50, peak max, then over request.
    inflate = re.search(r"^\s*0\s+inflate\s+3\s+3\s+\S+ \S+\s+\S+ \S+\s+\S+ \S+\s+3\s", out,
                        re.MULTILINE)
    deflate = re.search(r"^\s*1\s+deflate\s+3\s+3\s+\S+ \S+\s+\S+ \S+\s+\S+ \S+\s+0\s", out,
                        re.MULTILINE)
    assert inflate and deflate, out
    assert "Tasks over their memory request, or killed for memory: 3" in out, out

    model = read_trace(path)
    assert not model.problems, [str(p) for p in model.problems]
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    assert sorted(s.name or "" for s in executions) == ["deflate"] * 3 + ["inflate"] * 3
    for e in executions:
        requested, peak = e.args[L.ARG_MEMORY_REQUESTED], e.args[L.ARG_MEMORY_PEAK]
        assert peak == e.args[L.ARG_HEAP_PEAK]
        if e.name == "inflate":  # x16 the input, which it requested twice of
            assert peak >= 8 * requested and e.args[L.ARG_OVER_REQUEST] is True
        else:  # deflate requested twice its input and keeps an eighth
            assert peak < requested and L.ARG_OVER_REQUEST not in e.args

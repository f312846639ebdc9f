"""Jobs that Ray's OOM killer kills for real, each in a process with a Ray of its own.

Ray's memory monitor reads its settings when Ray starts, so a test that wants
a kill runs its job in a subprocess: the kill threshold is set ~1 GiB above
the machine's memory use at that moment (a machine already 90% used skips),
and the job prints its result as one ``RESULT <json>`` line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def preamble(oom_retries: int) -> str:
    """The job's first lines: the kill threshold, Ray's memory monitor, its OOM retries
    (``RAY_task_oom_retries``: unlimited by default, and a test would hang)."""
    return r"""
import json, os, sys, time

def used_fraction():
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":")
            info[key] = int(value.split()[0]) * 1024
    return 1 - info["MemAvailable"] / info["MemTotal"], info["MemTotal"]

used, total = used_fraction()
threshold = used + (1 << 30) / total
if threshold > 0.9:
    print("RESULT " + json.dumps({"skip": f"memory already {used:.0%} used"}))
    sys.exit(0)
os.environ["RAY_memory_usage_threshold"] = f"{threshold:.4f}"
os.environ["RAY_memory_monitor_refresh_ms"] = "100"
os.environ["RAY_task_oom_retries"] = "OOM_RETRIES"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
""".replace("OOM_RETRIES", str(int(oom_retries)))


def run_job(
    tmp: Path, text: str, args: list[str], timeout: float = 180, drop_tracer_env: bool = False
) -> dict[str, Any]:
    """Run ``text`` (a :func:`preamble` and the job) with ``args``; its RESULT, or skip.

    The job gets none of this process's ``RAY_`` variables (nor ``TRACER_`` ones with
    ``drop_tracer_env``)."""
    script = tmp / "job.py"
    script.write_text(text)
    dropped = ("RAY_", "TRACER_") if drop_tracer_env else ("RAY_",)
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env["RAY_AUTH_MODE"] = "disabled"
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    if "skip" in result:
        pytest.skip(result["skip"])
    return result

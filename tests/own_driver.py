"""A driver of its own on the tests' Ray, and what a run must not load where it runs.

Such a driver is a Ray job of its own (~1 s to start, where a Ray of its own takes
~8), whose workers are fresh processes: what they import is what its tasks made
them import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable

import ray

from tracer.ray import ENV_VAR

#: The writer, readers, protobuf and the tracer: loaded nowhere by a run at level 0,
#: and not needed by a worker to measure a task.
HEAVY = (
    "tracer.format",
    "tracer._proto",
    "tracer.ray.runner_tracer",
    "tracer.ray.timeline",
    "tracer.ray.ray_events",
    "tracer.ray.output",
)


def heavy(modules: Iterable[str]) -> list[str]:
    """Those of ``modules`` that are :data:`HEAVY`."""
    return [m for m in modules if m.startswith(HEAVY)]


def run_driver(code: str, **env: str) -> list[str]:
    """Run ``code`` as a driver on the tests' Ray (tracing not switched on by the
    environment, ``env`` added to it); the lines it printed."""
    environ = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    environ.update(env, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
        env=environ, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()

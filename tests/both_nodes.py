"""Making a run use both nodes of the tests' two-node cluster (1 CPU each)."""

from __future__ import annotations

import time
from pathlib import Path


def meet(folder: str, x: int) -> None:
    """In a task: hold its node's only CPU until two tasks have started, so both nodes run one.

    Ray does not promise to spread: the worker the owner already leased takes the
    next queued task, so short tasks can all run on the head (on a loaded machine,
    before the other node's worker has started). ``folder``: one per run. The
    timeout only stops a hang; the test then fails on its own assertion.
    """
    Path(folder, f"started-{x}").touch()
    deadline = time.monotonic() + 30
    while sum(1 for _ in Path(folder).glob("started-*")) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)

"""Daft's spelling of the runner tracer's calls, accepted by tracer's own API.

Daft's RayRunner calls ``task_received_as_ready(task_id, stage_id)`` and may
pass ``awaiting``'s arguments as ``waiting_for_num_results=`` and
``wait_timeout_s=``. No Ray is needed: these tasks are never submitted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tracer.format import read_trace
from tracer.ray import NullRunnerTracer, ResourceRequest, ray_tracer
from tracer.ray import layout as L


def test_daft_spelling_at_level_1(tmp_path: Path) -> None:
    path = tmp_path / "spelling.perfetto-trace"
    with ray_tracer("spelling", level=1, path=path) as tracer, tracer.dispatch_wave(1):
        tracer.task_created("t0", 3, ResourceRequest(num_cpus=1), "map")
        tracer.task_dispatched("t0")
        with tracer.awaiting(waiting_for_num_results=2, wait_timeout_s=0.5):
            pass
        with tracer.awaiting(1, wait_timeout_s=0.25):  # the two spellings mixed
            pass
        with tracer.awaiting(waiting_for_num_results=4):
            pass
        tracer.task_received_as_ready("t0", 3)  # Daft passes the stage id too
        assert not tracer.disabled
    model = read_trace(path, strict=True)
    awaiting = [s.args for s in model.slices if s.name == L.SLICE_AWAITING]
    assert awaiting == [
        {"num_returns": 2, "timeout_s": 0.5},
        {"num_returns": 1, "timeout_s": 0.25},
        {"num_returns": 4},
    ]
    (task,) = [s for s in model.slices if s.category == L.CAT_TASK and s.depth == 0]
    # Received (no status), not left unfinished at the close.
    assert task.args[L.ARG_TASK_ID] == "t0" and L.ARG_STATUS not in task.args


@pytest.mark.parametrize("level", [0, 1])
def test_both_spellings_of_one_argument_is_an_error_at_every_level(
    level: int, tmp_path: Path
) -> None:
    with ray_tracer("both", level=level, path=tmp_path / "both.perfetto-trace") as tracer:
        assert isinstance(tracer, NullRunnerTracer) == (level == 0)
        with pytest.raises(TypeError, match="num_returns and waiting_for_num_results"):
            tracer.awaiting(1, waiting_for_num_results=1)
        with pytest.raises(TypeError, match="timeout and wait_timeout_s"):
            tracer.awaiting(1, 0.1, wait_timeout_s=0.1)
        with tracer.awaiting(waiting_for_num_results=1, wait_timeout_s=None):
            pass
        tracer.task_received_as_ready("unknown", 0)

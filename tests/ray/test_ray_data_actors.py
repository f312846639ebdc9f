"""Ray Data's actor pools starting, on real Ray Data (one node).

An actor-pool operator runs no task until one of its actors is ready: an
actor whose ``__init__`` loads a model for seconds left the trace empty for
those seconds. Each actor is drawn from its creation until Ray Data saw it
ready, on the stage's *actors starting* lane, and ``tracer summary`` says how
long the stage's actors took to start.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="Ray Data needs pip install -e '.[raydata]'")

import ray
import ray.data
from engines_agree import assert_engines_agree
from ray_data_checks import check_data_trace, load_data_trace, only_trace
from ray_trace_checks import check_well_formed, load

import tracer.integrations.ray_data as traced_data
from tracer.format import read_trace
from tracer.integrations.ray_data import _compat
from tracer.query import QueryConfig, TraceQuery, records
from tracer.ray import layout as L

INIT_S = 1.0
STAGE = "1: ReadRange->MapBatches(SlowInit)"


class SlowInit:
    """An actor-pool UDF whose ``__init__`` takes a while (a model loaded)."""

    def __init__(self) -> None:
        time.sleep(INIT_S)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return batch


class BrokenInit:
    """An actor-pool UDF whose ``__init__`` raises."""

    def __init__(self) -> None:
        raise ValueError("no model at /models/x")

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return batch


pytestmark = pytest.mark.usefixtures("ray_data_quiet")  # tests/ray/conftest.py


def _actor_starts(model: Any) -> list[Any]:
    return [s for s in model.slices if s.name == L.SLICE_ACTOR_STARTING]


def test_an_actor_pool_s_start_is_drawn_and_summarised(tmp_path: Path) -> None:
    assert traced_data.enable(level=1, path=tmp_path)
    rows = ray.data.range(4, override_num_blocks=2).map_batches(
        SlowInit, concurrency=1).take_all()
    assert sorted(r["id"] for r in rows) == [0, 1, 2, 3]

    path = only_trace(tmp_path)
    model, rt = load_data_trace(path)
    check_data_trace(rt, {STAGE: 2})  # the layout is the same, with the lane below
    (actor,) = _actor_starts(model)
    assert actor.category == L.CAT_STAGE
    # From its creation (as its operator started, just before the trace was opened: drawn
    # from the run's start) until Ray Data saw it ready, __init__ included.
    assert actor.dur is not None and actor.dur >= INIT_S * 1e9
    assert actor.args[L.ARG_STAGE_ID] == 1 and actor.args[L.ARG_STAGE] == STAGE[3:]
    assert len(actor.args[L.ARG_ACTOR_ID]) == 32
    assert actor.args[L.ARG_NODE_ID] == ray.get_runtime_context().get_node_id()
    assert L.ARG_STATUS not in actor.args
    (run,) = [s for s in rt.loop_slices if s.depth == 0]
    assert actor.ts == run.ts and 0 <= actor.args[L.ARG_BEGAN_BEFORE_RUN] < 2e9
    # On the stage's 'actors starting' lane, under the stage's track: the stage's first
    # task was created once the actor was ready.
    tracks = model.tracks
    lane = tracks[actor.track_uuid]
    assert lane.name == L.ACTOR_START_TRACK
    (stage_track,) = [t for t in rt.stage_tracks if t.name == STAGE]
    assert lane.parent_uuid == stage_track.uuid
    first_task = min(t.ts for t in rt.task_slices)
    assert first_task >= actor.ts + actor.dur

    assert_engines_agree(path)
    with TraceQuery(path, QueryConfig(engine="reader")) as q:
        (row,) = records(q.actor_starts())
    assert row == {"stage_id": 1, "stage": STAGE[3:], "actors": 1, "ready": 1,
                   "start_p50_ns": actor.dur, "start_max_ns": actor.dur}
    out = subprocess.run(
        [sys.executable, "-m", "tracer", "summary", str(path), "--engine", "reader"],
        capture_output=True, text=True, check=True,
    ).stdout
    table = out.split("Actors starting", 1)[1].split("\n\n", 1)[0]
    (line,) = [x for x in table.splitlines() if "ReadRange->MapBatches(SlowInit)" in x]
    words = line.split()  # id, stage, actors, ready, p50 ("1.49 s"), max, share of the run
    assert words[2:4] == ["1", "1"] and words[5] == words[7] == "s", line


def test_an_actor_whose_init_raises_is_drawn_failed(tmp_path: Path) -> None:
    """Ray Data fails the execution (max_consecutive_actor_init_deaths is 0 by default);
    the actor's slice ends where Ray Data saw it die, with the UDF's error."""
    assert traced_data.enable(level=1, path=tmp_path)
    with pytest.raises(Exception, match="no model at /models/x"):
        ray.data.range(4, override_num_blocks=2).map_batches(
            BrokenInit, concurrency=1).take_all()
    path = only_trace(tmp_path)
    model = load(path)  # (no task ran: no task lanes, no counters of them)
    check_well_formed(model)
    (actor,) = _actor_starts(model)
    assert actor.args[L.ARG_STATUS] == L.STATUS_FAILED
    assert actor.args[L.ARG_ERROR_TYPE] == "ValueError"
    assert actor.args[L.ARG_ERROR] == "ValueError: no model at /models/x"
    assert actor.args[L.ARG_WORKER_PID] > 0
    assert_engines_agree(path)
    with TraceQuery(path, QueryConfig(engine="reader")) as q:
        (row,) = records(q.actor_starts())
    assert (row["actors"], row["ready"], row["start_max_ns"]) == (1, 0, None)


def test_a_pool_whose_internals_differ_is_not_drawn_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another Ray Data's pool: a method tracer wraps takes other arguments (here its
    ready ref's reader fails): tracing stops with one warning, the pipeline runs on, and
    the trace so far loads; a pool without the parts tracer reads is not watched."""
    assert _compat.actor_pool(object()) is None

    def changed(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise TypeError("pending_to_running() takes other arguments")

    monkeypatch.setattr(_compat, "ready_ref_arg", changed)
    assert traced_data.enable(level=1, path=tmp_path)
    with caplog.at_level(logging.WARNING, logger="tracer"):
        rows = ray.data.range(4, override_num_blocks=2).map_batches(
            SlowInit, concurrency=1).take_all()
    assert sorted(r["id"] for r in rows) == [0, 1, 2, 3]
    assert "tracing stopped for Ray Data execution" in caplog.text
    model = read_trace(only_trace(tmp_path))
    assert {p.kind for p in model.problems} <= {"unterminated_slice"}, model.problems

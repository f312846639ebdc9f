"""Traces for the query tests: real runs (levels 1 and 2), a truncated one, a synthetic one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import query_workloads
import synthetic_trace
from trace_bytes import cut_inside_a_record, uncompressed

from tracer.query import QueryConfig, TraceQuery


@pytest.fixture(scope="session")
def level1_trace(ray_manager: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sleep -> alloc -> boom (partition 3 fails), traced at level 1 on a real local Ray."""
    ray_manager.local()
    path = tmp_path_factory.mktemp("query") / "level1.perfetto-trace"
    return query_workloads.run(path, level=1)


@pytest.fixture(scope="session")
def level2_trace(ray_manager: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run at level 2 (every task under memray)."""
    ray_manager.local()
    path = tmp_path_factory.mktemp("query") / "level2.perfetto-trace"
    return query_workloads.run(path, level=2)


@pytest.fixture(scope="session")
def truncated_trace(level1_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The level-1 trace, uncompressed, cut inside a packet as a crash while writing an
    uncompressed trace leaves it: at 60% of its bytes, or earlier until the cut loses
    executions (the trace's tail may be Ray's events, written at the close)."""
    data = uncompressed(level1_trace.read_bytes())
    path = tmp_path_factory.mktemp("query") / "truncated.perfetto-trace"
    tasks = _task_rows(data, path)
    for fraction in (0.6, 0.5, 0.4, 0.3, 0.2):
        cut = cut_inside_a_record(data, fraction)
        if _task_rows(cut, path) < tasks:
            break
    path.write_bytes(cut)
    return path


def _task_rows(data: bytes, path: Path) -> int:
    """How many task attempts the reader engine finds in ``data`` (written to ``path``)."""
    path.write_bytes(data)
    return len(TraceQuery(path, QueryConfig(engine="reader")).task_latency())


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_trace.write(tmp_path_factory.mktemp("query") / "synthetic.perfetto-trace")

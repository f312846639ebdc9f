"""Traces for the query tests: real runs (levels 1 and 2), a truncated one, a synthetic one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import query_workloads
import synthetic_trace
from trace_bytes import cut_inside_a_record, uncompressed


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
    """The level-1 trace, uncompressed, cut at 60% of its bytes (inside a packet), as a
    crash while writing an uncompressed trace leaves it."""
    data = uncompressed(level1_trace.read_bytes())
    path = tmp_path_factory.mktemp("query") / "truncated.perfetto-trace"
    path.write_bytes(cut_inside_a_record(data, 0.6))
    return path


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_trace.write(tmp_path_factory.mktemp("query") / "synthetic.perfetto-trace")

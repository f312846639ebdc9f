"""Both query engines give the same answers on a trace: every analysis, every row.

Called by the tests that make the traces worth comparing on (a real run at
levels 1 and 2, two nodes, exceptions, retries and cancellations, a driver
killed with SIGKILL, a real OOM kill; see tests/query/test_query_engines.py
for the list). Without a trace_processor binary the comparison is skipped,
unless trace_processor is required (tests/tp_check.py), when it fails.

The engines agree exactly: both compute integer nanoseconds and bytes with the
same nearest-rank percentiles; floats (shares, means) are compared to 1e-12
relative, the rounding of one division done in SQLite's doubles vs Python's.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import tp_check
from pandas.testing import assert_frame_equal

from tracer.query import ANALYSES, QueryConfig, TraceQuery

BUCKETS = 7


def analysis(q: TraceQuery, name: str) -> pd.DataFrame:
    """One ready-made analysis (``worker_utilisation`` with ``BUCKETS`` buckets)."""
    if name == "worker_utilisation":
        return q.worker_utilisation(BUCKETS)
    result: pd.DataFrame = getattr(q, name)()
    return result


def same(a: pd.DataFrame, b: pd.DataFrame, name: str) -> None:
    assert_frame_equal(a, b, check_exact=False, rtol=1e-12, obj=name)


def assert_engines_agree(path: Path, bin_path: str | None = None) -> None:
    """Every analysis and ``run_info`` of ``path`` from the reader equal trace_processor's."""
    if bin_path is None:
        bin_path = tp_check.find_binary()
        if bin_path is None:
            if tp_check.required():
                pytest.fail("no trace_processor binary to compare the engines on "
                            f"({tp_check.REQUIRE_VAR} is set)")
            return
    reader = TraceQuery(path, QueryConfig(engine="reader"))
    config = QueryConfig(engine="trace_processor", trace_processor_path=bin_path)
    with TraceQuery(path, config) as tp:
        assert tp.engine == "trace_processor"
        for name in ANALYSES:
            same(analysis(tp, name), analysis(reader, name), f"{name} of {path.name}")
        assert tp.run_info() == reader.run_info()

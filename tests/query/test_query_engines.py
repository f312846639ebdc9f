"""Both engines give the same answers; finding (or not finding) trace_processor.

The SQL files run three ways here:

* in plain SQLite on tables shaped like trace_processor's (sqlite_tp.py),
  always, for the files that need no more of PerfettoSQL's standard library
  than sqlite_tp stands in for: the SQL is valid and computes what the
  reader engine computes;
* in a real trace_processor, when a binary can be found ($TRACE_PROCESSOR_PATH,
  the perfetto package's cache, or trace_processor_shell on PATH); skipped
  otherwise, with the reason (failed where it is required: tests/tp_check.py).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import sqlite_tp
from engines_agree import BUCKETS, assert_engines_agree, same
from engines_agree import analysis as _analysis

from tracer.query import (
    ANALYSES,
    TABLES,
    QueryConfig,
    QueryError,
    TraceProcessorError,
    TraceProcessorNotFoundError,
    TraceQuery,
    find_trace_processor,
    sql_text,
    to_frame,
)
from tracer.query.sql import worker_utilisation_sql

TRACES = ["level1_trace", "level2_trace", "truncated_trace", "synthetic"]
READER = QueryConfig(engine="reader")
_same = same


# ------------------------------------------------------------- the SQL files


def test_every_analysis_ships_as_a_sql_file() -> None:
    for name in (TABLES, *ANALYSES):
        text = sql_text(name)
        assert text.startswith(f"-- {name}.sql"), name
    with pytest.raises(KeyError):
        sql_text("nope")
    assert "SELECT 5 AS buckets" in worker_utilisation_sql(5)
    assert "debug.task_id" in sql_text(TABLES)


NONE_HERE = ("memory_flagged", "actor_starts", "stage_queues", "task_failures", "task_retries")


@pytest.mark.parametrize("trace", TRACES)
def test_sql_in_sqlite_agrees_with_the_reader(trace: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(trace)
    q = TraceQuery(path, READER)
    db = sqlite_tp.load(path)
    in_sqlite = [name for name in ANALYSES if sqlite_tp.runs_in_sqlite(name)]
    # The interval intersection is trace_processor's alone: checked there only.
    assert set(ANALYSES) - set(in_sqlite) == {"worker_utilisation"}
    for name in in_sqlite:
        from_sql = to_frame(sqlite_tp.analysis(db, name, BUCKETS), name)
        _same(from_sql, _analysis(q, name), name)
        if trace != "truncated_trace" or name != "memory_flagged":
            # (no run of theirs started actors or queued blocks: Ray Data's alone)
            assert len(from_sql) > 0 or name in NONE_HERE, name


def test_sqlite_check_can_fail(synthetic: Path) -> None:
    """The comparison above catches a wrong number (a guard against a vacuous check)."""
    db = sqlite_tp.load(synthetic)
    q = TraceQuery(synthetic, READER)
    tampered = sqlite_tp.run(db, sql_text("stage_summary").replace("(50 * n + 99)", "(60 * n)"))
    with pytest.raises(AssertionError):
        _same(to_frame(tampered, "stage_summary"), q.stage_summary(), "stage_summary")


# ------------------------------------------------------- real trace_processor


@pytest.fixture(scope="module")
def tp_bin(trace_processor_bin: str) -> str:
    return trace_processor_bin


@pytest.mark.parametrize("trace", TRACES)
def test_trace_processor_agrees_with_the_reader(
    trace: str, tp_bin: str, request: pytest.FixtureRequest
) -> None:
    """Here on real runs at levels 1 and 2, a cut copy and a synthetic trace; also on the
    traces of a two-node run (tests/ray/test_ray_cluster.py), exceptions, retries and
    cancellations (tests/robustness/test_task_failures.py), a driver killed with SIGKILL
    (tests/robustness/test_write_failures.py) and a real OOM kill
    (tests/ray/test_memory_oom.py), where those runs are made."""
    assert_engines_agree(request.getfixturevalue(trace), tp_bin)


def test_the_agreement_check_can_fail(synthetic: Path, tp_bin: str) -> None:
    """A wrong number in one engine is caught (a guard against a vacuous comparison)."""
    reader = TraceQuery(synthetic, QueryConfig(engine="reader"))
    with TraceQuery(synthetic, QueryConfig(engine="trace_processor",
                                           trace_processor_path=tp_bin)) as tp:
        theirs = _analysis(tp, "task_latency")
        theirs.loc[0, "total_ns"] += 1
        with pytest.raises(AssertionError):
            _same(theirs, _analysis(reader, "task_latency"), "task_latency")


def test_trace_processor_runs_any_sql(level1_trace: Path, tp_bin: str) -> None:
    with TraceQuery(level1_trace, QueryConfig(trace_processor_path=tp_bin)) as q:
        n = q.query("SELECT COUNT(*) AS n FROM tracer_task")["n"].iloc[0]
        assert n == len(TraceQuery(level1_trace, READER).task_latency())
        with pytest.raises(QueryError, match="query failed"):
            q.query("SELECT * FROM no_such_table")


# --------------------------------------------------- finding trace_processor


@pytest.fixture
def no_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A machine with no trace_processor anywhere tracer looks."""
    monkeypatch.delenv("TRACE_PROCESSOR_PATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))


def _fake_binary(tmp_path: Path, body: str = "exit 3") -> Path:
    path = tmp_path / "trace_processor_shell"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_no_binary_is_a_clear_error(no_binary: None) -> None:
    with pytest.raises(TraceProcessorNotFoundError) as err:
        find_trace_processor()
    message = str(err.value)
    assert "TRACE_PROCESSOR_PATH" in message
    assert "https://" in message  # where to get one
    assert "--engine reader" in message  # what works without it


def test_the_env_var_is_checked(
    no_binary: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRACE_PROCESSOR_PATH", str(tmp_path / "missing"))
    with pytest.raises(TraceProcessorNotFoundError, match="no such file"):
        find_trace_processor()
    plain = tmp_path / "plain"
    plain.write_text("")
    monkeypatch.setenv("TRACE_PROCESSOR_PATH", str(plain))
    with pytest.raises(TraceProcessorNotFoundError, match="not an executable"):
        find_trace_processor()
    fake = _fake_binary(tmp_path)
    monkeypatch.setenv("TRACE_PROCESSOR_PATH", str(fake))
    assert find_trace_processor() == str(fake)
    # An explicit path wins over the variable.
    (tmp_path / "other").mkdir()
    other = _fake_binary(tmp_path / "other")
    assert find_trace_processor(other) == str(other)


def test_path_lookup(no_binary: None, tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    fake = _fake_binary(tmp_path / "bin")
    assert find_trace_processor() == str(fake)


def test_the_default_engine_is_trace_processor_when_there_is_one(
    synthetic: Path, tp_bin: str
) -> None:
    assert QueryConfig().engine == "auto"
    with TraceQuery(synthetic) as q:
        assert q.engine == "trace_processor"
        assert q.warnings() == ["2 slice(s) never ended: the trace was probably cut while being "
                                "written; the answers cover what is there"]


def test_engines_without_a_binary(no_binary: None, synthetic: Path) -> None:
    default = TraceQuery(synthetic)
    assert default.engine == "reader"  # auto, and no binary anywhere
    assert default.warnings() == TraceQuery(synthetic, READER).warnings()
    auto = TraceQuery(synthetic, QueryConfig(engine="auto"))
    assert auto.engine == "reader"
    assert len(auto.stage_summary()) == 2
    with pytest.raises(TraceProcessorNotFoundError):
        TraceQuery(synthetic, QueryConfig(engine="trace_processor"))
    with pytest.raises(TraceProcessorNotFoundError):
        auto.query("SELECT 1")


def test_a_binary_that_fails_to_start(no_binary: None, synthetic: Path, tmp_path: Path) -> None:
    fake = _fake_binary(tmp_path, "echo broken >&2; exit 3")
    config = QueryConfig(engine="trace_processor", trace_processor_path=str(fake), load_timeout=2)
    with pytest.raises(TraceProcessorError) as err:
        TraceQuery(synthetic, config)
    # The binary is to blame, not the trace (it starts before it is given the trace):
    # what it said, and what to do.
    message = str(err.value)
    assert message.startswith(f"trace_processor ({fake}) failed to start (broken): point "
                              "TRACE_PROCESSOR_PATH"), message
    assert "could not load" not in message and str(synthetic) not in message
    assert "\n" not in message
    # auto: a binary that does not start is no binary; the reader answers, and says why.
    auto = TraceQuery(synthetic, QueryConfig(engine="auto", trace_processor_path=str(fake),
                                             load_timeout=2))
    assert auto.engine == "reader"
    warning = auto.warnings()[0]
    assert warning.startswith(f"trace_processor ({fake}) failed to start (broken): "), warning
    assert warning.endswith(" working trace_processor_shell binary (download one on a machine "
                            "with internet access from https://get.perfetto.dev/trace_processor,"
                            " or take the prebuilt of a Perfetto release at "
                            "https://github.com/google/perfetto/releases); used tracer's reader "
                            "instead"), warning
    assert ".;" not in warning
    assert len(auto.stage_summary()) == 2


def test_a_file_the_system_cannot_run_failed_to_start(
    no_binary: None, synthetic: Path, tmp_path: Path
) -> None:
    """Not a program at all (no shebang, another architecture): Popen's OSError, said as
    the binary's failure, not the trace's."""
    fake = tmp_path / "trace_processor_shell"
    fake.write_bytes(b"\x00\x01\x02 not a program")
    fake.chmod(0o755)
    config = QueryConfig(engine="trace_processor", trace_processor_path=str(fake), load_timeout=2)
    with pytest.raises(TraceProcessorError) as err:
        TraceQuery(synthetic, config)
    assert str(err.value).startswith(
        f"trace_processor ({fake}) failed to start (Exec format error): point "
    ), str(err.value)


def test_auto_says_why_a_named_binary_is_unusable(
    no_binary: None, monkeypatch: pytest.MonkeyPatch, synthetic: Path, tmp_path: Path
) -> None:
    """auto falls back to the reader, but a binary the user named and cannot be used is
    reported (a typo in TRACE_PROCESSOR_PATH must not go unnoticed); none anywhere is quiet."""
    plain = tmp_path / "plain"
    plain.write_text("")
    own = TraceQuery(synthetic, READER).warnings()  # the trace's own (2 unterminated slices)
    cases = [
        ("env", str(tmp_path / "missing"), "TRACE_PROCESSOR_PATH=", "no such file"),
        ("env", str(plain), "TRACE_PROCESSOR_PATH=", "not an executable"),
        ("env", str(tmp_path), "TRACE_PROCESSOR_PATH=", "is a folder, not the"),
        ("explicit", str(tmp_path / "missing"), "trace_processor binary ", "no such file"),
        ("explicit", str(plain), "trace_processor binary ", "not an executable"),
        ("explicit", str(tmp_path), "trace_processor binary ", "is a folder, not the"),
    ]
    for where, value, named, why in cases:
        if where == "env":
            monkeypatch.setenv("TRACE_PROCESSOR_PATH", value)
            config = QueryConfig(engine="auto")
        else:
            monkeypatch.delenv("TRACE_PROCESSOR_PATH", raising=False)
            config = QueryConfig(engine="auto", trace_processor_path=value)
        auto = TraceQuery(synthetic, config)
        assert auto.engine == "reader"
        warning, *rest = auto.warnings()
        assert rest == own
        assert warning.startswith(f"{named}{value}"), warning
        assert why in warning and warning.endswith("used tracer's reader instead"), warning
        assert len(auto.stage_summary()) == 2
    for empty in ("", None):
        if empty is None:
            monkeypatch.delenv("TRACE_PROCESSOR_PATH", raising=False)
        else:
            monkeypatch.setenv("TRACE_PROCESSOR_PATH", empty)
        quiet = TraceQuery(synthetic, QueryConfig(engine="auto"))
        assert quiet.engine == "reader"
        assert quiet.warnings() == own


def test_misuse_of_the_api_is_named(synthetic: Path) -> None:
    """`TraceQuery(path, "reader")` and `node_memory="64 GiB"` read naturally: the first
    says what to pass instead, the second is taken as `--node-memory` takes it."""
    from tracer.errors import InvalidArgumentTypeError

    with pytest.raises(InvalidArgumentTypeError, match=r"QueryConfig\(engine='reader'\)"):
        TraceQuery(synthetic, "reader")  # type: ignore[arg-type]
    with TraceQuery(synthetic, READER) as q:
        by_text = q.memory_suggestions(node_memory="64 GiB")
        assert by_text.equals(q.memory_suggestions(node_memory=64 << 30))
        assert set(by_text["node_memory_bytes"]) == {64 << 30}
        for bad in (1.5, "64 parsecs", 0, -1, True):
            with pytest.raises(ValueError, match="node_memory"):
                q.memory_suggestions(node_memory=bad)  # type: ignore[arg-type]


def test_buckets_are_bounded(synthetic: Path) -> None:
    """Millions of buckets take gigabytes to compute: both engines refuse them, by name."""
    from tracer.query.sql import MAX_BUCKETS

    with TraceQuery(synthetic, READER) as q:
        assert len(q.worker_utilisation(MAX_BUCKETS)) > 0
        with pytest.raises(ValueError, match=f"at most {MAX_BUCKETS}"):
            q.worker_utilisation(MAX_BUCKETS + 1)
    with pytest.raises(ValueError, match=f"at most {MAX_BUCKETS}"):
        worker_utilisation_sql(MAX_BUCKETS + 1)

"""The readers' C fast path (tracer/format/_readspeedups.c) reads what the Python code reads.

The C loop replays cached packet decodings; anything it does not take goes
to the Python code. Every reader is compared with and without it
(``TRACER_PURE_PYTHON=1``) on the same inputs: same model, same scan, same
errors. CI also runs all of tests/format with the fast path off.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scan_helpers import assert_same_model, scanned_model
from test_reader_problems import BAD_TRACES, SMALL_TRACES

from tracer.errors import TraceReadError
from tracer.format import _framing, _tokenizer, read_trace
from tracer.format.model import TraceModel

_readspeedups = pytest.importorskip(
    "tracer.format._readspeedups", reason="the C fast path was not built (no C compiler?)"
)
ROOT = Path(__file__).resolve().parents[2]


def _simulated_run() -> Any:
    spec = importlib.util.spec_from_file_location(
        "simulated_run", ROOT / "benchmarks" / "simulated_run.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["simulated_run"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fast") / "run.perfetto-trace"
    return _simulated_run().write_run(path, 2000, nodes=2)


def both(read: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """``read()`` with the C fast path, then without (each a result or a TraceReadError)."""
    results = []
    for pure in ("", "1"):
        monkeypatch.setenv("TRACER_PURE_PYTHON", pure)
        assert _tokenizer.use_read_speedups() == (pure == "")
        try:
            results.append(read())
        except TraceReadError as exc:
            results.append(exc)
    return results[0], results[1]


def assert_same(fast: Any, pure: Any) -> None:
    if isinstance(pure, TraceReadError):
        assert isinstance(fast, TraceReadError) and str(fast) == str(pure)
        return
    assert isinstance(fast, TraceModel) and isinstance(pure, TraceModel)
    assert_same_model(pure, fast)
    assert fast.problems == pure.problems


def test_the_fast_path_replays_most_packets(
    run_trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packets the C loop replays never reach _Tokenizer.replay."""
    replays = {"": 0, "1": 0}
    python_replay = _tokenizer._Tokenizer.replay

    def counted(self: Any, template: Any, raw: int) -> None:
        replays[os.environ["TRACER_PURE_PYTHON"]] += 1
        python_replay(self, template, raw)

    monkeypatch.setattr(_tokenizer._Tokenizer, "replay", counted)
    fast, pure = both(lambda: read_trace(run_trace), monkeypatch)
    assert_same(fast, pure)
    assert replays["1"] > fast.packet_count // 2  # most packets are replays...
    assert replays[""] < fast.packet_count // 100  # ...and C takes nearly all of them


@pytest.mark.parametrize("chunk", [None, 5, 300])
def test_runner_traces_read_the_same(
    run_trace: Path, chunk: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if chunk is not None:
        monkeypatch.setattr(_framing, "CHUNK_SIZE", chunk)
    assert_same(*both(lambda: read_trace(run_trace), monkeypatch))
    assert_same(*both(lambda: scanned_model(run_trace), monkeypatch))


@pytest.mark.parametrize("kind", sorted(BAD_TRACES))
def test_problem_traces_read_the_same(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = BAD_TRACES[kind]()
    assert_same(*both(lambda: read_trace(data), monkeypatch))
    assert_same(*both(lambda: read_trace(data, strict=True), monkeypatch))


@settings(max_examples=200, deadline=None)
@given(
    compress=st.booleans(),
    edits=st.lists(
        st.tuples(st.sampled_from(["set", "delete", "insert", "cut"]), st.integers(0, 1 << 16),
                  st.binary(min_size=1, max_size=8)),
        min_size=1, max_size=6),
)
def test_damaged_traces_read_the_same(compress: bool, edits: list[tuple[str, int, bytes]]) -> None:
    data = bytearray(SMALL_TRACES[compress])
    for op, position, chunk in edits:
        at = position % (len(data) + 1)
        if op == "set" and data:
            data[at % len(data)] = chunk[0]
        elif op == "delete":
            del data[at : at + len(chunk)]
        elif op == "insert":
            data[at:at] = chunk
        else:
            del data[at:]
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert_same(*both(lambda: read_trace(bytes(data)), monkeypatch))


def test_bad_arguments_raise_instead_of_crashing() -> None:
    with pytest.raises(TypeError):
        _readspeedups.replay_run(object(), b"\x0a\x00", 0, 0)  # too few
    with pytest.raises(TypeError):
        _readspeedups.replay_run(object(), "not bytes", 0, 0, False)
    with pytest.raises(AttributeError):
        _readspeedups.replay_run(object(), b"\x0a\x02\x40\x01", 0, 0, False)

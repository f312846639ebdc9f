"""tracer.testing as users meet it: a test file of their own, run by pytest (pytester),
with real Ray and memray inside.

One inner session (in this process, on the suite's local Ray) runs tests that
pass and fail on purpose; the outcomes and the messages are what is checked.
The inner pipelines build their stage functions inside a function, so Ray
ships them by value (the inner test module is not importable by workers).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Imported here, not first in the inner session: pytester removes the modules an
# inline run imported when it ends, and these must stay the suite's own.
import tracer.query
import tracer.ray.levels
import tracer.ray.output
import tracer.runner
import tracer.testing.checks
import tracer.testing.run
from tracer.testing import MARKERS

INNER = '''
import pytest
from tracer.runner import Pipeline, Stage
from tracer.sizes import InvalidSizeError
from tracer.testing import MemoryBudgetError, TracedMemoryError

MIB = 1 << 20


def pipeline(request_mib):
    """grow: 16 MiB per task (requesting request_mib); small: nothing, asks 64 MiB."""
    return Pipeline(list(range(3)), [
        Stage("grow", lambda x: len(bytearray(16 * MIB)) + x, memory_bytes=request_mib * MIB),
        Stage("small", lambda x: x + 1, memory_bytes=64 * MIB),
    ])


def test_under_requested(traced_memory):
    with traced_memory as run:
        pipeline(4).run(progress=False)
    run.assert_within_request()


def test_right_sized(traced_memory):
    with traced_memory as run:
        pipeline(32).run(progress=False)
    run.assert_within_request()
    run.assert_stage_peak("grow", "20 MiB", stat="p95")
    run.assert_no_oom_kill()
    grow = run.stages["grow"]
    assert [t.task_id for t in grow] == ["0-0", "0-1", "0-2"]
    assert all(16 * MIB <= t.peak < 17 * MIB and t.requested == 32 * MIB for t in grow)
    assert all(t.node.startswith("Node 0") and t.worker.startswith("worker ") for t in grow)
    assert 16 * MIB <= run.stage_peak("grow") < 17 * MIB
    # The same run against budgets it breaks, and input that cannot be checked.
    with pytest.raises(MemoryBudgetError, match="more than 0.5x their memory request"):
        run.assert_within_request(factor=0.5)
    # Up to 1 MiB of Ray's own threads in memray's figures (as the outer test's rows).
    with pytest.raises(
        MemoryBudgetError, match=r"'grow': max peak 16(\\.\\d+)? MiB .* over its budget"
    ):
        run.assert_stage_peak("grow", "16 MiB")
    with pytest.raises(TracedMemoryError, match="no stage named 'grwo'.*stages: 'grow', 'small'"):
        run.assert_stage_peak("grwo", "20 MiB")
    with pytest.raises(InvalidSizeError, match="'20 MB/s' is not a size"):
        run.assert_stage_peak("grow", "20 MB/s")


@pytest.mark.stage_memory_limit("grow", "8 MiB")
def test_marker_over_budget():
    pipeline(32).run(progress=False)


@pytest.mark.memory_within_request
@pytest.mark.stage_memory_limit("grow", "20 MiB", stat="p95")
def test_markers_pass():
    pipeline(32).run(progress=False)


@pytest.mark.stage_memory_limit("grow", "8 MB/s")
def test_marker_bad_budget(tmp_path):
    (tmp_path / "ran").write_text("the body ran")


def test_block_without_traced_task(traced_memory):
    with traced_memory:
        pass


def test_explicit_level_wins(traced_memory):
    with traced_memory:
        pipeline(32).run(progress=False, tracing_level=1)


@pytest.mark.memory_within_request
def test_marker_and_fixture(traced_memory):
    with traced_memory:
        pass
'''


def test_budgets_pass_and_fail_as_written(
    ray_local: None, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_before = {k: v for k, v in os.environ.items() if k.startswith("TRACER_")}
    # The markers' folders go to the system's temporary folder: this test's own, here
    # (so that they can be counted, and tp_check checks the traces kept there).
    system_tmp = pytester.path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "-rf")
    result.assert_outcomes(passed=2, failed=6)
    out = result.stdout.str()
    failures = _failures(out)
    assert set(failures) == {
        "test_under_requested", "test_marker_over_budget", "test_marker_bad_budget",
        "test_block_without_traced_task", "test_explicit_level_wins",
        "test_marker_and_fixture",
    }, out

    # Too small a request: every grow task named, with where it ran and its numbers.
    under = failures["test_under_requested"]
    assert "MemoryBudgetError: 3 of 6 task(s) used more than their memory request" in under
    # 16 MiB each; memray also counts what Ray's own threads allocate meanwhile, which
    # a loaded machine makes more of (as in tests/ray/test_memory_ray.py): up to 1 MiB.
    rows = re.findall(
        r"^E\s+grow\s+(0-\d)\s+0\s+(Node 0 \(\w+\))\s+(worker \d+)\s+4 MiB\s+"
        r"16(?:\.\d+)? MiB\s+(4\.\d\d)x$",
        under, re.MULTILINE,
    )
    assert sorted(r[0] for r in rows) == ["0-0", "0-1", "0-2"], under
    assert all(4.0 <= float(r[3]) < 4.2 for r in rows), under
    assert "'grow': 22020096 bytes (21 MiB)" in under  # 16 MiB x 1.25, up to a MiB
    assert "Stage(memory_bytes=...) in tracer's runner" in under
    kept = _kept_traces(under)
    assert len(kept) == 1 and kept[0].is_file()
    assert "small" not in re.findall(r"^E\s+(\w+)\s+\d-\d", under, re.MULTILINE)
    assert "test_inner.py:" in under  # the failure points at the test's own line

    over = failures["test_marker_over_budget"]
    assert re.search(r"stage 'grow': max peak 16(\.\d+)? MiB", over), over  # as the rows above
    assert "over its budget 8 MiB" in over
    marker_traces = _kept_traces(over)
    assert len(marker_traces) == 1 and marker_traces[0].is_file()
    # Kept for the failed test; the marked tests that passed or never ran left nothing.
    assert marker_traces[0].parent.parent.parent == system_tmp
    assert [p.name.startswith("tracer-memory-") for p in system_tmp.iterdir()] == [True]

    bad = failures["test_marker_bad_budget"]
    assert "InvalidSizeError: stage_memory_limit budget for stage 'grow' '8 MB/s' is not a size" \
        in bad
    assert not list(pytester.path.rglob("ran")), "the body of a test with a bad budget ran"

    assert "TracedMemoryError: the block wrote no trace" in failures[
        "test_block_without_traced_task"]
    assert "was written at tracing level 1, not 2" in failures["test_explicit_level_wins"]
    assert "traced memory blocks do not nest" in failures["test_marker_and_fixture"]
    # Every block gave the environment back as it found it.
    assert {k: v for k, v in os.environ.items() if k.startswith("TRACER_")} == env_before


def _failures(out: str) -> dict[str, str]:
    """Each failed test's section of the report, by test name."""
    parts = re.split(r"^_{3,} (test_\w+) _{3,}$", out, flags=re.MULTILINE)
    sections = dict(zip(parts[1::2], parts[2::2], strict=True))
    for name, text in sections.items():
        sections[name] = text.split("short test summary info")[0]
    return sections


def _kept_traces(section: str) -> list[Path]:
    # "E" starts every line of the message, or only its first when pytest hides every
    # frame (a marker's check fails after the test's body).
    found = re.findall(r"^E?\s+(/\S+\.perfetto-trace)$", section, re.MULTILINE)
    return [Path(p) for p in found]


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    for line in MARKERS.values():
        result.stdout.fnmatch_lines([f"@pytest.mark.{line}"])


def test_loading_the_plugin_imports_nothing_heavy() -> None:
    code = (
        "import sys, tracer.testing; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('ray', 'memray', 'pandas', 'numpy', 'perfetto') or m.startswith('tracer.query')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stdout
    # The names it spells out (so as not to import tracer.ray) are tracer.ray's.
    assert tracer.testing.run.LEVEL_ENV_VAR == tracer.ray.levels.ENV_VAR
    assert tracer.testing.run.TRACE_DIR_ENV_VAR == tracer.ray.output.TRACE_DIR_ENV_VAR

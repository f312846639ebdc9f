"""The examples run as scripts (each starts its own local Ray) and print a readable trace."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tracer.format.reader import read_trace
from tracer.ray import layout as L

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str, *args: str, level_env: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.pop("TRACER_ENABLE_RAY_TRACING", None)
    if level_env is not None:
        env["TRACER_ENABLE_RAY_TRACING"] = level_env
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _printed_trace(stdout: str) -> Path:
    match = re.search(r"^trace written to (.+)$", stdout, re.MULTILINE)
    assert match, stdout
    assert "ui.perfetto.dev" in stdout and "tracer open " in stdout
    return Path(match.group(1))


def _stage_executions(path: Path) -> dict[str, int]:
    assert path.is_file() and path.stat().st_size > 0
    model = read_trace(path)
    assert not model.problems, [str(p) for p in model.problems]
    counts: dict[str, int] = {}
    for s in model.slices:
        if s.category == L.CAT_EXECUTION:
            counts[s.name or ""] = counts.get(s.name or "", 0) + 1
    return counts


def test_quickstart_default_trace_path() -> None:
    out = _run("quickstart.py", "--num-partitions", "4")
    path = _printed_trace(out)
    assert path.parent.name == "tracer" and path.parent.parent.name == "logs"
    assert path.name.startswith("pipeline.") and path.name.endswith(".perfetto-trace")
    assert _stage_executions(path) == {"tokenize": 4, "count words": 4, "top word": 4}


@pytest.mark.parametrize("level", ["1", "0"])
def test_big_task_heap_usage(level: str, tmp_path: Path) -> None:
    """Also: an explicit --tracing-level wins over the environment's level (here 2)."""
    path = tmp_path / "big.perfetto-trace"
    out = _run(
        "big_task_heap_usage.py",
        "--num-partitions", "3",
        "--num-rows-per-partition", "1000",
        "--inflation-factor", "10",
        "--deflation-factor", "5",
        "--tracing-level", level,
        "--trace-out", str(path),
        level_env="2",
    )
    # 3 x 1000 rows of 64 bytes, x10 then /5 (each row cut to 128 bytes).
    assert "0.2 MiB in, 1.8 MiB after inflate (x10), 0.4 MiB after deflate (/5)" in out, out
    if level == "0":
        assert "tracing is off" in out and not path.exists()
        return
    assert _printed_trace(out) == path
    assert _stage_executions(path) == {"inflate": 3, "deflate": 3}
    (execution,) = [s for s in read_trace(path).slices if s.name == L.SLICE_EXECUTION]
    assert execution.args["tracing_level"] == 1


def test_the_environments_level_0_is_the_default(tmp_path: Path) -> None:
    """TRACER_ENABLE_RAY_TRACING=0 and no --tracing-level: the run goes on, untraced. (One
    example run: each reads the variable through resolve_level(default=), which
    test_a_bad_level_in_the_environment_is_a_usage_error shows for all three.)"""
    out_dir = tmp_path / "traces"
    out_dir.mkdir()
    out = _run("quickstart.py", "--num-partitions", "2", "--trace-out",
               str(out_dir / "t.perfetto-trace"), level_env="0")
    assert "tracing is off (level 0): no trace written" in out, out
    assert "trace written to" not in out and list(out_dir.iterdir()) == []


@pytest.mark.parametrize("script", ["quickstart.py", "big_task_heap_usage.py",
                                    "ray_data_inflate.py"])
def test_a_bad_level_in_the_environment_is_a_usage_error(script: str) -> None:
    env = {**os.environ, "TRACER_ENABLE_RAY_TRACING": "loud"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # The library's own words for it (tracer.ray.resolve_level), before Ray starts.
    assert "invalid $TRACER_ENABLE_RAY_TRACING 'loud'; valid levels: 0 (off)" in proc.stderr
    assert "Traceback" not in proc.stderr and "Started a local Ray" not in proc.stderr


def test_help_says_the_defaults() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "big_task_heap_usage.py"), "--help"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # argparse wraps to the terminal's width
    for needle in ["--num-partitions NUM_PARTITIONS how many partitions", "(default 8)",
                   "rows of 64 bytes in each partition (default 200000)",
                   "repeats every row this many times (default 16)",
                   "keeps 1/this of every row (default 8)",
                   "default: $TRACER_ENABLE_RAY_TRACING when set, else 1"]:
        assert needle in text, proc.stdout


def test_ray_data_example_without_its_extra_says_what_to_install() -> None:
    """Without pyarrow (the raydata extra), one line and exit status 2, not a traceback."""
    script = str(EXAMPLES / "ray_data_inflate.py")
    no_pyarrow = (
        "import runpy, sys; sys.modules['pyarrow'] = None; "  # import pyarrow: not found
        f"sys.argv = [{script!r}]; runpy.run_path({script!r}, run_name='__main__')"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRACER_ENABLE_RAY_TRACING"}
    proc = subprocess.run(
        [sys.executable, "-c", no_pyarrow],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "ray_data_inflate.py: error: Ray Data needs pyarrow, which is not installed: install "
        "tracer's raydata extra, pip install -e '.[raydata]' (from the project root)"
    ]


@pytest.mark.parametrize(
    ("script", "args", "needle"),
    [
        ("quickstart.py", ["--tracing-level", "3"], "invalid tracing level '3'"),
        ("quickstart.py", ["--num-partitions", "0"], "must be at least 1"),
        ("big_task_heap_usage.py", ["--tracing-level", "loud"], "invalid tracing level 'loud'"),
        ("ray_data_inflate.py", ["--tracing-level", "x"], "invalid tracing level 'x'"),
    ],
)
def test_bad_arguments_are_usage_errors_before_ray_starts(
    script: str, args: list[str], needle: str
) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr  # refused before Ray started


def test_a_trace_that_cannot_be_written_is_not_called_level_0(tmp_path: Path) -> None:
    out = _run("quickstart.py", "--num-partitions", "2",
               "--trace-out", str(tmp_path / "no" / "such" / "folder" / "t.perfetto-trace"))
    assert "top word of the first" in out  # the run itself went on
    assert "tracing is off (level 0)" not in out
    assert "the trace file could not be written" in out


def test_write_a_trace_into_a_folder_and_nowhere(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "write_a_trace.py"), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert read_trace(tmp_path / "example.perfetto-trace").slices
    nowhere = subprocess.run(
        [sys.executable, str(EXAMPLES / "write_a_trace.py"), "--out",
         str(tmp_path / "missing" / "t.perfetto-trace")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert nowhere.returncode == 1
    assert "does not exist" in nowhere.stderr and "Traceback" not in nowhere.stderr

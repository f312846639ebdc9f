"""Open a trace in the real Perfetto UI (../shared/perfetto-ui/ui-screenshot.sh) and read back
what it shows: the track tree as the UI models it, its dialogs, import errors and flows.

The script serves Perfetto's own UI (v58.2, unmodified) on 127.0.0.1:10000, its engine
(trace_processor_shell --httpd) on 127.0.0.1:9001, and drives headless Chromium; it writes
screenshots and text dumps to an output folder, which is left where it is (a failing test
names it) so that its PNGs can be looked at.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The script, beside the repository (CI's clean clone has ../shared linked in); or
#: $TRACER_PERFETTO_UI_SCRIPT.
SCRIPT = Path(
    os.environ.get("TRACER_PERFETTO_UI_SCRIPT")
    or REPO.parent / "shared" / "perfetto-ui" / "ui-screenshot.sh"
)
#: Where each test leaves the UI's screenshots and dumps (one folder per test, replaced
#: by its next run): $TRACER_UI_OUT, else .ui-screenshots/ in the repository (not
#: pytest's tmp_path, which later runs rotate away).
OUT_ROOT = Path(os.environ.get("TRACER_UI_OUT") or REPO / ".ui-screenshots")
PORTS = (10000, 9001)
#: The Chromium the script is given: the real one with frames unthrottled (see the file for why).
UNTHROTTLED_CHROMIUM = Path(__file__).with_name("chromium-unthrottled")
#: The one dialog a load through the native accelerator shows (the script answers it).
ACCELERATOR_DIALOG = "Use trace processor native acceleration?"


def script() -> Path:
    if not SCRIPT.is_file():
        pytest.skip(f"no Perfetto UI script at {SCRIPT} (../shared/perfetto-ui)")
    return SCRIPT


@dataclasses.dataclass
class Node:
    """One track node of the UI's workspace, with its children in display order."""

    name: str
    attrs: list[str]
    slice_names: dict[str, int]
    children: list[Node] = dataclasses.field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.children]

    def child(self, name: str) -> Node:
        (found,) = [c for c in self.children if c.name == name]
        return found

    def attr(self, key: str) -> str | None:
        for a in self.attrs:
            if a.startswith(key + "="):
                return a.split("=", 1)[1]
        return None

    @property
    def renderer(self) -> str | None:
        return self.attr("renderer")

    def count(self, what: str) -> int:
        """'slices' (instants included, as trace_processor keeps them), 'instants' or
        'counter values' on the node's own tracks."""
        for a in self.attrs:
            m = re.fullmatch(rf"(\d+) {what}", a)
            if m:
                return int(m.group(1))
        return 0

    @property
    def expanded(self) -> bool:
        return "expanded" in self.attrs

    def walk(self) -> list[Node]:
        out = [self]
        for c in self.children:
            out.extend(c.walk())
        return out


@dataclasses.dataclass
class UiRun:
    out: Path
    roots: list[Node]
    pinned: list[str]
    report: dict[str, Any]
    import_errors: str
    flows: list[str]
    console: str

    def root(self, name: str) -> Node:
        (found,) = [r for r in self.roots if r.name == name]
        return found

    def where(self) -> str:
        return f"(the UI's screenshots and dumps: {self.out})"


def out_dir(request: pytest.FixtureRequest) -> Path:
    """A fresh folder for this test's UI output, kept after the test."""
    name = re.sub(r"[^\w.-]+", "_", request.node.name)
    out = OUT_ROOT / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out


def _busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_for_ports(limit_s: float = 70.0) -> None:
    """Another run's servers (or `tracer open`'s) may still hold the ports a little."""
    deadline = time.monotonic() + limit_s
    while any(_busy(p) for p in PORTS):
        if time.monotonic() > deadline:
            busy = [p for p in PORTS if _busy(p)]
            raise AssertionError(f"ports {busy} on 127.0.0.1 stay busy: the UI cannot be run")
        time.sleep(0.5)


def _script_env() -> dict[str, str]:
    """The script's environment: its Chromium wrapped in ``chromium-unthrottled`` when there is
    one to wrap (otherwise the script installs it, as on first use)."""
    env = dict(os.environ)
    real = env.get("CHROMIUM", "/usr/bin/chromium")
    if os.access(real, os.X_OK) and os.access(UNTHROTTLED_CHROMIUM, os.X_OK):
        env["TRACER_UI_REAL_CHROMIUM"] = real
        env["CHROMIUM"] = str(UNTHROTTLED_CHROMIUM)
    return env


def render(trace: Path, out: Path, *options: str, timeout_s: float = 400) -> UiRun:
    """Open ``trace`` in the real UI; what it showed (``out`` keeps the files)."""
    tool = script()
    _wait_for_ports()
    proc = subprocess.run(
        [str(tool), str(trace), str(out), "--info=no", *options],
        capture_output=True, text=True, timeout=timeout_s, check=False, env=_script_env(),
    )
    log = (proc.stdout + proc.stderr)[-4000:]
    (out / "script.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"ui-screenshot.sh exited {proc.returncode} ({out}):\n{log}"
    flat = json.loads((out / "track-tree.json").read_text())
    roots: list[Node] = []
    stack: list[Node] = []
    for row in flat:
        node = Node(row["name"] or "", row["attrs"], dict(row["sliceNames"]))
        depth = row["depth"]
        del stack[depth:]
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)
    tree_text = (out / "track-tree.txt").read_text().splitlines()
    pinned: list[str] = []
    if tree_text and tree_text[0] == "# pinned":
        for line in tree_text[1:]:
            if line.startswith("#"):
                break
            pinned.append(line.strip())
    return UiRun(
        out=out,
        roots=roots,
        pinned=pinned,
        report=json.loads((out / "report.json").read_text()),
        import_errors=(out / "import-errors.txt").read_text(),
        flows=(out / "flows.txt").read_text().splitlines(),
        console=(out / "console.txt").read_text(),
    )


def assert_loaded_cleanly(run: UiRun) -> None:
    """No problem the script saw, no dialog but the accelerator's, no import error or data
    loss, no exception in the page."""
    where = run.where()
    assert run.report["problems"] == [], (run.report["problems"], where)
    assert run.report["engine"] == "HTTP_RPC", where
    assert run.report["dialogs"] == [ACCELERATOR_DIALOG], (run.report["dialogs"], where)
    assert run.report["importErrors"] == 0, where
    assert run.report["loadingErrors"] == [], where
    assert run.import_errors.rstrip().endswith("stats with severity error/data_loss and "
                                               "value != 0:\n(none)"), (run.import_errors, where)
    assert "[pageerror]" not in run.console, where

"""Regenerate ``perfetto_trace_subset_pb2.py`` from ``protos/``.

Run ``python -m tracer._proto.regenerate`` after editing the .proto file
(needs the ``dev`` extra, which brings ``grpcio-tools``). The generated module
is committed so that users never need protoc; ``tests/format/test_schema.py``
regenerates into a temporary folder and fails when the committed copy is stale.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

PROTO_NAME = "perfetto_trace_subset.proto"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = PROJECT_ROOT / "protos"
OUT_DIR = Path(__file__).resolve().parent
GENERATED_NAME = "perfetto_trace_subset_pb2.py"


def generate(out_dir: Path) -> Path:
    """Run protoc (from grpcio-tools) on the subset schema into ``out_dir``."""
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        PROTO_NAME,
    ]
    subprocess.run(cmd, check=True)
    return out_dir / GENERATED_NAME


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp))
        for src in (generated, generated.with_suffix(".pyi")):
            (OUT_DIR / src.name).write_bytes(src.read_bytes())
    print(f"regenerated {OUT_DIR / GENERATED_NAME}")


if __name__ == "__main__":
    main()

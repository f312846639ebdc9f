"""The inflate/deflate workload as a Ray Data pipeline, traced with no change to the pipeline.

    python examples/ray_data_inflate.py [--num-blocks N] [--num-rows-per-block R]
        [--inflation-factor F] [--deflation-factor D] [--request-factor Q]
        [--tracing-level 0|1|2] [--trace-dir FOLDER]

``ray.data.range(N * R)`` in N blocks -> ``map_batches(inflate)``, which
repeats every row's 64 bytes F times and asks Ray for only Q times its
input (``memory=``, far too little) -> ``map_batches(deflate)``, which keeps
1/D of every row. The pipeline is plain Ray Data: tracing is switched on
around it by ``tracer.integrations.ray_data.enable(level=...)`` (the same as
running it with ``RAY_DATA_EXECUTION_CALLBACKS=tracer.integrations.ray_data.TracingCallback``
and ``TRACER_ENABLE_RAY_TRACING=1``). At level 2 every map task runs under
memray in its worker, and the table at the end (``tracer memory``'s) shows
each operator's requested vs actual heap peak: inflate far over its request.

It needs Ray Data's own dependencies (``pip install -e '.[raydata]'``; without
them it says so and exits with status 2). It runs on the cluster named by
``$RAY_ADDRESS``, or on a local Ray it starts (2 CPUs), at tracing level
``--tracing-level``, else ``$TRACER_ENABLE_RAY_TRACING`` when set, else 1. The
trace goes to ``--trace-dir``, or by default to the Ray session's
``logs/tracer`` folder; the script prints where.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from tracer.cli.memory import memory_report
from tracer.errors import InvalidTracingLevelError
from tracer.ray import ENV_VAR as LEVEL_ENV_VAR
from tracer.ray import TracingLevel, resolve_level

ROW_BYTES = 64
MIB = 1 << 20


def make_rows(batch: dict[str, Any]) -> dict[str, Any]:
    """Each id becomes a row of ROW_BYTES pseudo-random bytes (one uint8 array per batch)."""
    ids = np.asarray(batch["id"], dtype=np.uint64)
    rng = np.random.default_rng(int(ids[0]) if len(ids) else 0)
    return {"row": rng.integers(0, 256, size=(len(ids), ROW_BYTES), dtype=np.uint8)}


def inflate(batch: dict[str, Any], factor: int) -> dict[str, Any]:
    """Every row's bytes repeated ``factor`` times: the block grows ``factor``-fold."""
    return {"row": np.tile(np.stack(batch["row"]), (1, factor))}


def deflate(batch: dict[str, Any], factor: int) -> dict[str, Any]:
    """Every row cut to 1/``factor`` of its length (a copy)."""
    rows = np.stack(batch["row"])
    return {"row": rows[:, : max(1, rows.shape[1] // factor)].copy()}


def import_ray_data() -> Any:
    """``tracer.integrations.ray_data``, imported with Ray Data; without Ray Data's own
    dependencies (pyarrow, ...: the ``raydata`` extra), a one-line error and exit status 2."""
    try:
        import ray.data  # noqa: F401

        import tracer.integrations.ray_data as traced_data
    except ModuleNotFoundError as exc:
        print(
            f"ray_data_inflate.py: error: Ray Data needs {exc.name or exc}, which is not "
            "installed: install tracer's raydata extra, pip install -e '.[raydata]' "
            "(from the project root)",
            file=sys.stderr,
        )
        sys.exit(2)
    return traced_data


def start_ray(object_store_memory: int) -> None:
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
    else:
        ray.init(
            address="local", num_cpus=2, object_store_memory=object_store_memory,
            include_dashboard=False,
        )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _no_trace(level: TracingLevel) -> str:
    if level == TracingLevel.OFF:
        return "tracing is off (level 0): no trace written"
    return "no trace written: the trace file could not be written (the warning above says why)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--num-blocks", type=_positive, default=8,
        help="how many blocks, one task per map each (default %(default)s)",
    )
    parser.add_argument(
        "--num-rows-per-block", type=_positive, default=50_000,
        help=f"rows of {ROW_BYTES} bytes in each block (default %(default)s)",
    )
    parser.add_argument(
        "--inflation-factor", type=_positive, default=16,
        help="inflate repeats every row this many times (default %(default)s)",
    )
    parser.add_argument(
        "--deflation-factor", type=_positive, default=8,
        help="deflate keeps 1/this of every row (default %(default)s)",
    )
    parser.add_argument(
        "--request-factor", type=_positive, default=2,
        help="each map asks for this many times its input size as memory, "
        "map_batches(memory=...) (default %(default)s)",
    )
    parser.add_argument(
        "--tracing-level", default=None, metavar="LEVEL",
        help=f"0 (off), 1 (timeline) or 2 (memory); default: ${LEVEL_ENV_VAR} when set, else 1",
    )
    parser.add_argument(
        "--trace-dir", type=Path, default=None,
        help="folder for the trace (default: <Ray session>/logs/tracer)",
    )
    args = parser.parse_args()
    try:  # checked before Ray starts: 0/1/2 or off/timeline/memory
        args.tracing_level = resolve_level(args.tracing_level, default=TracingLevel.TIMELINE)
    except InvalidTracingLevelError as exc:
        parser.error(str(exc))
    n, rows = args.num_blocks, args.num_rows_per_block
    inflation, deflation = args.inflation_factor, args.deflation_factor
    block_bytes = rows * ROW_BYTES

    traced_data = import_ray_data()
    start_ray(int(min(max(8 * block_bytes * inflation, 80 * MIB), 4096 * MIB)))
    ray.data.DataContext.get_current().enable_progress_bars = False
    traced = traced_data.enable(level=args.tracing_level, path=args.trace_dir)

    start = time.monotonic()
    ds = (
        ray.data.range(n * rows, override_num_blocks=n)
        .map_batches(make_rows, batch_size=None)
        .map_batches(
            inflate, fn_kwargs={"factor": inflation}, batch_size=None,
            memory=args.request_factor * block_bytes,
        )
        .map_batches(
            deflate, fn_kwargs={"factor": deflation}, batch_size=None,
            memory=args.request_factor * block_bytes * inflation,
        )
    )
    out = ds.materialize()
    elapsed = time.monotonic() - start
    size_out = out.size_bytes()
    print(
        f"{n} blocks of {rows} rows: {n * block_bytes / MIB:.1f} MiB in, "
        f"{n * block_bytes * inflation / MIB:.1f} MiB after inflate (x{inflation}), "
        f"{size_out / MIB:.1f} MiB after deflate (/{deflation}); {elapsed:.1f} s"
    )
    paths = traced_data.trace_paths()
    if not traced or not paths:
        print(_no_trace(args.tracing_level))
        return
    print(memory_report(paths[-1]))
    print(f"trace written to {paths[-1]}")
    print("open it at https://ui.perfetto.dev (Open trace file), or run:")
    print(f"  tracer open {paths[-1]}")


if __name__ == "__main__":
    main()

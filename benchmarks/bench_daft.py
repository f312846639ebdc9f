"""What tracer costs Daft's legacy RayRunner, against Daft's own tracer.

Run by hand (it is not a test), from the project root, with the daft extra:

    .venv/bin/python benchmarks/bench_daft.py                     # ~1-2 min on 2 cores
    .venv/bin/python benchmarks/bench_daft.py --partitions 32 --repeats 3

It starts a local Ray and runs one Daft query on the legacy RayRunner
(``--partitions`` tasks of a no-op UDF, plus Daft's own) in these
configurations, interleaved and rotated in every repetition:

* ``daft``: Daft's own ``daft.runners.ray_tracing``, tracing off (the baseline);
* ``daft-tracing`` (only when asked for, ``--configs``): Daft's own tracer on
  (its Chrome JSON, its metrics actor). It writes under
  ``/tmp/ray/session_latest``, wherever that points: when another Ray
  session starts on the machine meanwhile, its ``open`` fails in Daft's
  scheduler thread and the query waits forever (seen on the shared 2-core
  machine);
* ``off``: ``tracer.integrations.daft`` installed, tracing off (target: no
  measurable cost, the median within the baseline's spread);
* ``level1`` and ``level2``: ``tracer.integrations.daft`` at levels 1 and 2.

It prints each one's median wall time, its spread (min to max) and its
ratio to the baseline's median. Switching between Daft's module and ours is
``install()`` / ``uninstall()`` in between (the path for a runner module
already imported).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import daft
import ray

import tracer.integrations.daft as tdaft
from tracer.ray import ENV_VAR

CONFIGS = ("daft", "daft-tracing", "off", "level1", "level2")
DEFAULT_CONFIGS = ("daft", "off", "level1", "level2")


@daft.udf(return_dtype=daft.DataType.int64())
def same(x: Any) -> Any:
    return x


def query(partitions: int, tracing: bool) -> float:
    """Wall seconds of one query (its result checked)."""
    start = time.perf_counter()
    with daft.execution_config_ctx(use_legacy_ray_runner=True, enable_ray_tracing=tracing):
        df = daft.from_pydict({"x": list(range(partitions * 10))}).into_partitions(partitions)
        out = df.with_column("y", same(daft.col("x"))).to_pydict()
    elapsed = time.perf_counter() - start
    assert sorted(out["y"]) == list(range(partitions * 10))
    return elapsed


def run(config: str, partitions: int) -> float:
    ours = config in ("off", "level1", "level2")
    if ours:
        tdaft.install()
    else:
        tdaft.uninstall()
    os.environ.pop(ENV_VAR, None)
    if config == "level2":
        os.environ[ENV_VAR] = "2"
    try:
        return query(partitions, tracing=config in ("daft-tracing", "level1", "level2"))
    finally:
        os.environ.pop(ENV_VAR, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=64, help="tasks of the UDF per query")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--configs", default=",".join(DEFAULT_CONFIGS),
        help=f"comma-separated, of {', '.join(CONFIGS)}",
    )
    args = parser.parse_args()
    configs = args.configs.split(",")
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configs {sorted(unknown)}; known: {', '.join(CONFIGS)}")

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    daft.set_runner_ray(noop_if_initialized=True)
    for config in configs:  # warm-up: workers started, functions exported
        run(config, args.partitions)
    times: dict[str, list[float]] = defaultdict(list)
    for rep in range(args.repeats):
        order = configs[rep % len(configs):] + configs[: rep % len(configs)]
        for config in order:
            times[config].append(run(config, args.partitions))
        print(f"  rep {rep + 1}/{args.repeats}: "
              + ", ".join(f"{c} {times[c][-1]:.3f} s" for c in configs), flush=True)

    base: Callable[[], float] = lambda: statistics.median(times[configs[0]])  # noqa: E731
    print(f"\n{args.partitions} UDF tasks per query, {args.repeats} repeats, "
          f"ratios to the median of {configs[0]!r}")
    print(f"{'config':<14} {'median':>9} {'min':>9} {'max':>9} {'ratio':>7}")
    for config in configs:
        values = times[config]
        median = statistics.median(values)
        print(f"{config:<14} {median:>8.3f}s {min(values):>8.3f}s {max(values):>8.3f}s "
              f"{median / base():>6.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

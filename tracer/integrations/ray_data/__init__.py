"""Ray Data pipelines traced with no code change.

Switch it on for a whole program from the environment::

    RAY_DATA_EXECUTION_CALLBACKS=tracer.integrations.ray_data.TracingCallback \
    TRACER_ENABLE_RAY_TRACING=1 python my_pipeline.py

or from Python, before building the datasets::

    import tracer.integrations.ray_data as traced_data
    traced_data.enable(level=2)            # path=FOLDER: where the traces go

Every dataset execution then writes one trace in the runner's layout
(Scheduler = Ray Data's scheduling loop, tasks, stages = physical operators,
nodes and workers with each map task measured where it ran, memory), named
``ray-data.<dataset>.<timestamp>.perfetto-trace`` in the Ray session's
``logs/tracer`` folder (logged at INFO on the ``tracer`` logger;
:func:`trace_paths` lists them). Its names import Ray Data on first use.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracer.integrations.ray_data.callback import (
        CONFIG_KEY,
        Settings,
        TracingCallback,
        disable,
        enable,
        settings,
        trace_paths,
    )

# Every public name is the callback module's, loaded on first use: every worker that
# runs a traced map task imports this package (its code is in .worker), and what the
# driver needs (the callback, the run timeline, the trace writer) took ~65 ms of each
# such worker's CPU to import.


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'tracer.integrations.ray_data' has no attribute {name!r}")
    from tracer.integrations.ray_data import callback

    value = getattr(callback, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "CONFIG_KEY",
    "Settings",
    "TracingCallback",
    "disable",
    "enable",
    "settings",
    "trace_paths",
]

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
:func:`trace_paths` lists them). Importing this module imports Ray Data.
"""

from tracer.integrations.ray_data.callback import (
    CONFIG_KEY,
    Settings,
    TracingCallback,
    disable,
    enable,
    settings,
    trace_paths,
)

__all__ = [
    "CONFIG_KEY",
    "Settings",
    "TracingCallback",
    "disable",
    "enable",
    "settings",
    "trace_paths",
]

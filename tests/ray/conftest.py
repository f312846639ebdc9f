"""Fixtures the Ray Data test files share (``pytestmark = usefixtures("ray_data_quiet")``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def ray_data_module(ray_local: None) -> Iterator[None]:
    """The tests' local Ray for a module of Ray Data tests; tracing off at its end (and the
    job's metrics actor with it)."""
    yield
    from tracer.integrations import ray_data as traced_data

    traced_data.disable()


@pytest.fixture
def ray_data_quiet(ray_data_module: None) -> Iterator[None]:
    """No progress bars; tracing off between tests, the metrics actor kept for the next (as
    in one program)."""
    import ray.data

    from tracer.integrations import ray_data as traced_data
    from tracer.integrations.ray_data import _compat

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield
    with contextlib.suppress(KeyError):
        ctx.remove_config(traced_data.CONFIG_KEY)
    _compat.unregister_callback(ctx, traced_data.TracingCallback)

"""The reference runner: map-only partition pipelines on Ray, traced through :mod:`tracer.ray`."""

from tracer.runner.pipeline import (
    Pipeline,
    PipelineTimeoutError,
    Stage,
    UnsatisfiableResourcesError,
)

__all__ = ["Pipeline", "PipelineTimeoutError", "Stage", "UnsatisfiableResourcesError"]

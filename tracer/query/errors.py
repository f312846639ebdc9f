"""Errors of the query layer (all are :class:`~tracer.errors.TracerError`)."""

from __future__ import annotations

from tracer.errors import TracerError

__all__ = ["QueryError", "TraceProcessorError", "TraceProcessorNotFoundError"]


class TraceProcessorNotFoundError(TracerError, RuntimeError):
    """No trace_processor binary can be had on this machine."""


class TraceProcessorError(TracerError, RuntimeError):
    """trace_processor failed to start or to load the trace."""


class QueryError(TracerError, ValueError):
    """trace_processor rejected a query (bad SQL, unknown table or column)."""

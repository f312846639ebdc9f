"""tracer: native Perfetto tracing for task runners built on Ray."""

__version__ = "0.1.0"

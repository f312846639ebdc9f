"""Layer 3: engines traced through tracer's public API (``tracer.integrations.daft``, ...).

Each integration imports its engine only when used, so this package imports
without any engine installed.
"""

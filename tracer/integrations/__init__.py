"""Integrations: engines traced without changing their users' code (layer 3).

Each is built on the public API of the Ray layer (``tracer.ray``, its run
timeline) and imports its engine only when imported itself.
"""

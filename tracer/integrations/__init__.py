"""Layer 3: engines traced without changing their users' code
(``tracer.integrations.daft``, ``tracer.integrations.ray_data``).

Each is built on the public API of the Ray layer (``tracer.ray``, its run
timeline) and imports its engine only when used, so this package imports
without any engine installed.
"""

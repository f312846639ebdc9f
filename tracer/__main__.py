"""``python -m tracer``: the ``tracer`` command line (see :mod:`tracer.cli`)."""

from tracer.cli import main

raise SystemExit(main())

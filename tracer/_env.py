"""Reading tracer's environment variables: one rule for every switch, one for every duration.

A variable is often set far from the code that reads it (a job's
environment, a cluster's runtime_env), so a value it does not understand
must neither break the job nor quietly mean something else: each reader
here warns once per variable and value, on the ``tracer`` logger, and uses
the default. The rules:

* switches (:func:`env_flag`): ``1``, ``true``, ``yes``, ``on`` turn it on;
  ``0``, ``false``, ``no``, ``off`` turn it off (any case, spaces around
  ignored); unset or empty (``VAR=``, as shells and CI templates leave it)
  is the default.
* durations in seconds (:func:`env_seconds`): a finite number, 0 or more
  (``inf`` would overflow a lock's timeout, ``nan`` compares as nothing).

Standard library only, and nothing of tracer's: :mod:`tracer.format` reads
``TRACER_PURE_PYTHON`` through it without loading the Ray layer.
"""

from __future__ import annotations

import logging
import math
import os
import threading

__all__ = ["env_flag", "env_seconds", "warn_once"]

logger = logging.getLogger("tracer")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(message: str) -> None:
    """Log ``message`` as a warning on the ``tracer`` logger, the first time only.

    Readers run at every writer, tracer or task: a bad value is said once
    per process, not once per run.
    """
    with _warned_lock:
        if message in _warned:
            return
        _warned.add(message)
    logger.warning(message)


def env_flag(name: str, default: bool) -> bool:
    """The switch ``$name``: see the module's rule; anything else warns and is ``default``."""
    raw = os.environ.get(name)
    text = "" if raw is None else raw.strip().lower()
    if not text:
        return default
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    warn_once(
        f"tracer: ignoring {name}={raw!r} (valid: 1, true, yes, on or 0, false, no, off); "
        f"using the default, {'on' if default else 'off'}"
    )
    return default


def env_seconds(name: str, default: float) -> float:
    """The duration ``$name`` in seconds; unset or empty is ``default``.

    Anything but a finite number of 0 or more warns and is ``default``.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value >= 0:
        return value
    warn_once(
        f"tracer: ignoring {name}={raw!r} (not a finite number of seconds, 0 or more); "
        f"using the default, {default:g} s"
    )
    return default

"""Tracing never breaks the job: the guard around the runner tracer's methods.

Any error inside a guarded method (a full disk, a bug) disables tracing once,
with one warning, and the method returns as if nothing happened: the run goes
on untraced with correct results. The calls a dispatch loop makes for every
wave and task spell the same guard out inline (see :mod:`tracer.ray.runner_loop`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["guarded", "guarded_failures"]

_F = TypeVar("_F", bound=Callable[..., Any])


def guarded(method: _F) -> _F:
    """Run a tracer method; on any error, disable tracing once instead of failing the job.

    The calls a dispatch loop makes for every wave and task spell the same
    guard out inline (see :mod:`tracer.ray.runner_loop`).
    """

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._disabled:
            return None
        try:
            with self._lock:
                return method(self, *args, **kwargs)
        except Exception as exc:
            self._disable(exc)
            return None

    return wrapper  # type: ignore[return-value]


def guarded_failures(method: _F) -> _F:
    """:func:`guarded` for the methods that report failures: they always return a dict.

    Once tracing has stopped (or if the method fails), they return the
    failures already found and not yet reported, never None: a runner that
    iterates over the result must not break because tracing did.
    """

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._disabled:
            try:
                with self._lock:
                    return method(self, *args, **kwargs)
            except Exception as exc:
                self._disable(exc)
        with self._lock:
            return self._take_failures()

    return wrapper  # type: ignore[return-value]

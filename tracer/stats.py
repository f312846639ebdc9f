"""The one definition of a percentile in tracer.

A stage slice's ``p50``, ``tracer summary``'s p50/p95 columns (both query
engines' SQL and Python), and the memory budgets of :mod:`tracer.testing`
must give the same number for the same tasks, or a user comparing them sees
two answers. All of them take the nearest rank (the value at rank
``ceil(p * n / 100)``, as trace_processor's SQL in ``tracer/query/sql``
computes it): always one of the measured values, never an average of two.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["nearest_rank"]


def nearest_rank(values: Iterable[int], p: int) -> int | None:
    """The nearest-rank ``p``-th percentile (1 to 100) of ``values``; None when empty."""
    if not 1 <= p <= 100:
        raise ValueError(f"a percentile is from 1 to 100, got {p!r}")
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[(p * len(ordered) + 99) // 100 - 1]

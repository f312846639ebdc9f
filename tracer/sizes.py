"""Byte sizes as people write them: ``"512 MiB"``, ``"1.5GB"``, ``"100 KB"``.

For memory budgets (``tracer.testing``) and command-line options
(``tracer memory --node-memory``). The units follow pytest-memray's
``limit_memory``, the model users of memory-budget tests know: ``KB``,
``MB``, ... are powers of 1024, like ``KiB``, ``MiB``, ... (a budget written
for one means the same in the other), and so are the one-letter ``K``, ``M``,
``G``, ... of ``docker --memory 4g`` and ``free -h`` and Kubernetes' ``Gi``
(``--node-memory 4G`` was refused, and meant nothing else). Parsing is strict: a number, optional
spaces, one of the units, nothing else; anything else is an
:class:`InvalidSizeError` that names what was given and what is accepted.
Stdlib only: the pytest plugin imports this in every test session.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from tracer.errors import InvalidArgumentError

__all__ = ["UNITS", "InvalidSizeError", "format_size", "parse_size"]

#: Multipliers, by unit in upper case. KB, KiB, K and Ki are all 1024 bytes (pytest-memray's
#: rule for KB; K as docker and free(1) mean it, Ki as Kubernetes does).
UNITS: dict[str, int] = {"B": 1}
for _power, _letter in enumerate("KMGTP", start=1):
    for _unit in (f"{_letter}B", f"{_letter}IB", _letter, f"{_letter}I"):
        UNITS[_unit] = 1 << (10 * _power)
del _power, _letter, _unit

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([A-Za-z]+)\s*", re.ASCII)
_ACCEPTED = (
    "a number and a unit, e.g. '512 MiB', '1.5GB', '100 KB', '4G' (units B, KB, MB, GB, TB, "
    "PB, or KiB, MiB, ..., or K, M, G, T, P; KB = KiB = K = 1024 bytes)"
)


class InvalidSizeError(InvalidArgumentError):
    """A byte size that is not one: a typo in a budget, a unit tracer does not know."""


def parse_size(value: str | int, what: str = "size") -> int:
    """Bytes from ``"512 MiB"``-style text (rounded down to a whole byte), or an int of bytes.

    ``what`` names the value in the error (``"budget"``, ``"--node-memory"``).
    Negative numbers, bools, floats, a missing unit, an unknown unit and
    trailing text are errors.
    """
    __tracebackhide__ = True  # pytest: a failing test's traceback stops at its caller
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidSizeError(
            f"{what} must be a size string ({_ACCEPTED}) or an int of bytes, "
            f"got {type(value).__name__} {value!r}"
        )
    if isinstance(value, int):
        if value < 0:
            raise InvalidSizeError(f"{what} must not be negative, got {value}")
        return value
    match = _SIZE.fullmatch(value)
    if match is None:
        raise InvalidSizeError(f"{what} {value!r} is not a size: expected {_ACCEPTED}")
    number, unit = match.groups()
    multiplier = UNITS.get(unit.upper())
    if multiplier is None:
        raise InvalidSizeError(
            f"{what} {value!r} has an unknown unit {unit!r}: expected {_ACCEPTED}"
        )
    try:
        return int(Decimal(number) * multiplier)
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimal numbers
        raise InvalidSizeError(f"{what} {value!r} is not a size: expected {_ACCEPTED}") from None


def format_size(n: int | float) -> str:
    """Bytes in binary units, to two decimals: ``512 B``, ``10 MiB``, ``1.25 GiB``."""
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.2f}".rstrip("0").rstrip(".") + f" {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover

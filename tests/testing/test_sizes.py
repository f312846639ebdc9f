"""Byte sizes as budgets are written: strict, with errors that say what is accepted."""

from __future__ import annotations

from typing import Any

import pytest

from tracer.errors import TracerError
from tracer.sizes import InvalidSizeError, format_size, parse_size

MIB = 1 << 20


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512 MiB", 512 * MIB),
        ("1.5GB", 3 * (1 << 29)),
        ("100 KB", 102_400),
        ("100 kib", 102_400),
        ("1b", 1),
        (" 3 MiB ", 3 * MIB),
        (".5 KiB", 512),
        ("0.3 KiB", 307),  # rounded down to a whole byte
        ("0 B", 0),
        ("2 TiB", 2 << 40),
        ("1 PB", 1 << 50),
        ("4G", 4 << 30),  # as docker --memory and free -h write it
        ("1 M", MIB),
        ("16k", 16 << 10),
        ("2Gi", 2 << 30),  # as Kubernetes does
        (4096, 4096),
    ],
)
def test_sizes(text: Any, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "bad",
    ["512", "MiB", "-1 MiB", "1 MiBs", "1e3 MB", "1,5 GB", "", "1 X", "1 MiBB", "1 MiB extra",
     "\uff11 MiB", "1 mb/s", "nan MB", "inf GiB", "1..5 MB", "+1 MB"],
)
def test_not_sizes(bad: str) -> None:
    with pytest.raises(InvalidSizeError) as info:
        parse_size(bad, "budget")
    message = str(info.value)
    assert message.startswith(f"budget {bad!r}")
    assert "'512 MiB'" in message  # says what would do


@pytest.mark.parametrize("bad", [1.5, True, None, -3, b"1 MiB"])
def test_not_sizes_by_type(bad: Any) -> None:
    with pytest.raises(InvalidSizeError, match="budget"):
        parse_size(bad, "budget")


def test_errors_are_tracer_errors_and_value_errors() -> None:
    with pytest.raises(TracerError):
        parse_size("lots")
    with pytest.raises(ValueError):
        parse_size("lots")


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (16 * MIB + 9, "16 MiB"),
     (int(1.25 * (1 << 30)), "1.25 GiB"), (-2 * MIB, "-2 MiB")],
)
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text

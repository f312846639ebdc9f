"""is_missing: what every table and JSON answer shows as missing (-, null).

It answers Python's ints, strings and floats itself (without importing pandas,
which the command line loads only for the commands that need it) and asks
pandas about the rest: its NA and NaT, numpy's scalars.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tracer.query import is_missing, records


@pytest.mark.parametrize(
    ("value", "missing"),
    [
        (None, True),
        (float("nan"), True),
        (math.nan, True),
        (np.float64("nan"), True),
        (pd.NA, True),
        (pd.NaT, True),
        (0, False),
        (-1, False),
        (2**70, False),
        ("", False),
        ("nan", False),
        (0.0, False),
        (float("inf"), False),
        (np.int64(0), False),
        (np.float64(1.5), False),
        (True, False),
        (False, False),
    ],
)
def test_is_missing(value: Any, missing: bool) -> None:
    assert is_missing(value) is missing


def test_records_turn_every_kind_of_missing_into_none() -> None:
    frame = pd.DataFrame({
        "n": pd.array([1, None], dtype="Int64"),
        "f": [0.5, float("nan")],
        "s": pd.array(["a", None], dtype="string"),
    })
    assert records(frame) == [{"n": 1, "f": 0.5, "s": "a"}, {"n": None, "f": None, "s": None}]

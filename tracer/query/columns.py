"""The columns of every analysis, and the one way both engines turn rows into a DataFrame.

Both engines (trace_processor and the reader) produce the same columns with
the same dtypes: integers as pandas' nullable ``Int64`` (nanoseconds and
bytes stay exact), fractions as ``float64`` (NaN when undefined) and text as
``string``.

pandas is imported on first use, not with this module: the command line
builds its options from here without paying for it (~0.4 s).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SCHEMAS", "Kind", "records", "to_frame", "unique_names"]

Kind = Literal["int", "float", "str"]

_I: Kind = "int"
_F: Kind = "float"
_S: Kind = "str"

SCHEMAS: dict[str, list[tuple[str, Kind]]] = {
    "stage_summary": [
        ("stage_id", _I),
        ("stage", _S),
        ("tasks", _I),
        ("failed", _I),
        ("wall_ns", _I),
        ("dur_p50_ns", _I),
        ("dur_p95_ns", _I),
        ("dur_max_ns", _I),
        ("memory_requested", _I),
        ("peak_p50_bytes", _I),
        ("peak_max_bytes", _I),
        ("over_request", _I),
    ],
    "actor_starts": [
        ("stage_id", _I),
        ("stage", _S),
        ("actors", _I),
        ("ready", _I),
        ("start_p50_ns", _I),
        ("start_max_ns", _I),
    ],
    "task_failures": [
        ("task_id", _S),
        ("attempt", _I),
        ("stage_id", _I),
        ("stage", _S),
        ("status", _S),
        ("error_type", _S),
        ("error", _S),
    ],
    "task_retries": [
        ("task_id", _S),
        ("attempt", _I),
        ("stage_id", _I),
        ("stage", _S),
        ("status", _S),
        ("ray_attempts", _I),
        ("unmeasured_attempts", _I),
        ("failed_attempts_seen", _I),
        ("error_type", _S),
        ("memory_at_kill", _I),
        ("failed_node", _S),
        ("failed_worker", _S),
        ("lost_ns", _I),
        ("node", _S),
    ],
    "stage_queues": [
        ("stage_id", _I),
        ("stage", _S),
        ("queued_blocks_max", _I),
        ("backpressured_ns", _I),
    ],
    "task_latency": [
        ("task_id", _S),
        ("attempt", _I),
        ("stage_id", _I),
        ("stage", _S),
        ("status", _S),
        ("node", _S),
        ("worker", _S),
        ("created_ts", _I),
        ("waiting_ns", _I),
        ("scheduling_ns", _I),
        ("running_ns", _I),
        ("pickup_ns", _I),
        ("total_ns", _I),
        ("memory_requested", _I),
        ("memory_peak", _I),
        ("peak_source", _S),
        ("sched_queue_ns", _I),
        ("sched_push_ns", _I),
        ("sched_args_ns", _I),
        ("sched_start_ns", _I),
        ("pickup_store_ns", _I),
        ("pickup_notify_ns", _I),
        ("pickup_loop_ns", _I),
    ],
    "latency_by_stage": [
        ("stage_id", _I),
        ("stage", _S),
        ("tasks", _I),
        ("waiting_p50_ns", _I),
        ("waiting_p95_ns", _I),
        ("scheduling_p50_ns", _I),
        ("scheduling_p95_ns", _I),
        ("running_p50_ns", _I),
        ("running_p95_ns", _I),
        ("pickup_p50_ns", _I),
        ("pickup_p95_ns", _I),
        ("total_p50_ns", _I),
        ("total_p95_ns", _I),
        ("sched_queue_p50_ns", _I),
        ("sched_queue_p95_ns", _I),
        ("sched_push_p50_ns", _I),
        ("sched_push_p95_ns", _I),
        ("sched_args_p50_ns", _I),
        ("sched_args_p95_ns", _I),
        ("sched_start_p50_ns", _I),
        ("sched_start_p95_ns", _I),
        ("pickup_store_p50_ns", _I),
        ("pickup_store_p95_ns", _I),
        ("pickup_notify_p50_ns", _I),
        ("pickup_notify_p95_ns", _I),
        ("pickup_loop_p50_ns", _I),
        ("pickup_loop_p95_ns", _I),
    ],
    "dispatch_loop": [
        ("phase", _S),
        ("count", _I),
        ("total_ns", _I),
        ("mean_ns", _F),
        ("share", _F),
    ],
    "worker_utilisation": [
        ("node", _S),
        ("worker", _S),
        ("bucket", _I),
        ("start_ns", _I),
        ("bucket_ns", _I),
        ("busy_ns", _I),
        ("busy_fraction", _F),
        ("busy_with_ray_ns", _I),
        ("busy_with_ray_fraction", _F),
    ],
    "memory_by_stage": [
        ("stage_id", _I),
        ("stage", _S),
        ("tasks", _I),
        ("measured", _I),
        ("requested_bytes", _I),
        ("peak_p50_bytes", _I),
        ("peak_max_bytes", _I),
        ("over_request", _I),
        ("no_request", _I),
        ("oom_killed", _I),
        ("peak_to_request_max", _F),
    ],
    "memory_by_node": [
        ("node", _S),
        ("tasks", _I),
        ("peak_p50_bytes", _I),
        ("peak_max_bytes", _I),
        ("over_request", _I),
        ("excess_max_bytes", _I),
        ("oom_killed", _I),
    ],
    "memory_flagged": [
        ("task_id", _S),
        ("attempt", _I),
        ("stage_id", _I),
        ("stage", _S),
        ("node", _S),
        ("worker", _S),
        ("reason", _S),
        ("requested_bytes", _I),
        ("peak_bytes", _I),
        ("peak_source", _S),
        ("excess_bytes", _I),
        ("ratio", _F),
    ],
}

_DTYPES: dict[Kind, Any] = {"int": "Int64", "float": "float64", "str": "string"}


def to_frame(data: pd.DataFrame | Sequence[Mapping[str, Any]], name: str) -> pd.DataFrame:
    """Rows (dicts) or a trace_processor DataFrame as analysis ``name``'s typed DataFrame."""
    import pandas as pd

    schema = SCHEMAS[name]
    columns = [c for c, _ in schema]
    if isinstance(data, pd.DataFrame):
        missing = [c for c in columns if c not in data.columns]
        if missing:
            raise KeyError(f"{name}: the query returned no column(s) {missing}")
        frame = data.loc[:, columns].reset_index(drop=True)
        frame = frame.astype(object).where(frame.notna(), None)
    else:
        frame = pd.DataFrame([[row.get(c) for c in columns] for row in data], columns=columns,
                             dtype=object)
    out = {}
    for column, kind in schema:
        values = [None if is_missing(v) else v for v in frame[column].tolist()]
        if kind == "int":
            values = [_int_or_none(v) for v in values]
        elif kind == "float":
            values = [float("nan") if v is None else _float_or_nan(v) for v in values]
        else:
            values = [None if v is None else str(v) for v in values]
        out[column] = pd.array(values, dtype=_DTYPES[kind])
    return pd.DataFrame(out, columns=columns)


def _int_or_none(value: Any) -> int | None:
    """An int cell; a value that is no finite number (from a trace written elsewhere) is missing."""
    if value is None:
        return None
    if isinstance(value, int):
        return int(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) else None


def _float_or_nan(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def is_missing(value: Any) -> bool:
    """None, NaN, pandas' NA or NaT: a value an analysis did not have (a cell to show as -)."""
    if value is None:
        return True
    kind = type(value)
    if kind is int or kind is str:
        return False
    if kind is float:
        return bool(value != value)  # NaN
    import pandas as pd

    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def unique_names(columns: Sequence[Any]) -> list[str]:
    """Column names made unique the way pandas does (``name``, ``name.1``, ...): SQL lets two
    result columns share a name (``SELECT s.name, t.name``), a dict or JSON object does not."""
    names: list[str] = []
    taken = {str(c) for c in columns}
    seen: dict[str, int] = {}
    for column in columns:
        name = str(column)
        if name in seen:
            k = seen[name]
            while f"{name}.{k}" in taken:
                k += 1
            seen[name] = k + 1
            name = f"{name}.{k}"
            taken.add(name)
        else:
            seen[name] = 1
        names.append(name)
    return names


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A DataFrame as JSON-ready dicts: Python ints, floats and strings, None for missing.

    Columns that share a name keep every value: the later ones are keyed
    ``name.1``, ``name.2`` (:func:`unique_names`). Bytes (an SQL blob) are
    written as hex, and infinite floats as the strings ``"inf"`` / ``"-inf"``,
    which JSON has no number for.
    """
    rows: list[dict[str, Any]] = []
    columns = unique_names(list(frame.columns))
    for values in frame.itertuples(index=False, name=None):
        rows.append({column: _plain(value) for column, value in zip(columns, values, strict=True)})
    return rows


def _plain(value: Any) -> Any:
    if is_missing(value):
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()  # numpy scalars
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value

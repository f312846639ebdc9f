"""Tables for people (a terminal, or plain text when piped) and JSON / CSV for machines."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from tracer.query import is_missing, records, unique_names

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "Column",
    "Style",
    "fmt_bytes",
    "fmt_count",
    "fmt_dur",
    "fmt_name",
    "fmt_share",
    "name_column",
    "print_json",
    "render_csv",
    "render_frame",
    "render_table",
    "sparkline",
]


@dataclasses.dataclass(frozen=True)
class Style:
    """How to draw: ``rich`` on a terminal (bold, box rules, µ, blocks), else plain ASCII."""

    rich: bool
    color: bool

    @classmethod
    def for_stream(cls, stream: TextIO) -> Style:
        tty = bool(getattr(stream, "isatty", lambda: False)())
        color = tty and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
        return cls(rich=tty, color=color)

    def bold(self, text: str) -> str:
        return f"\033[1m{text}\033[0m" if self.color else text

    def dim(self, text: str) -> str:
        return f"\033[2m{text}\033[0m" if self.color else text


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: its header, the row key, how to format a value, and alignment."""

    header: str
    key: str
    fmt: Callable[[Any, Style], str] | None = None
    right: bool = True
    #: Longer values are cut to this many characters (None: never). For names: a
    #: stage named by a whole query plan would push every other column off the
    #: screen (the JSON output has them whole).
    max_width: int | None = None


#: The widest a name (a stage's, a node's, a task's) is shown in a table.
NAME_WIDTH = 48


def name_column(header: str, key: str) -> Column:
    """A left-aligned column of names, cut to :data:`NAME_WIDTH`."""
    return Column(header, key, right=False, max_width=NAME_WIDTH)


def fmt_dur(ns: Any, style: Style) -> str:
    """Nanoseconds as a short duration: 812 ns, 81.8 µs, 5.41 ms, 1.14 s, 12 min."""
    if is_missing(ns):
        return "-"
    value = float(ns)
    sign = "-" if value < 0 else ""
    value = abs(value)
    micro = "µs" if style.rich else "us"
    if value < 1e3:
        return f"{sign}{value:.0f} ns"
    for limit, div, unit in ((1e6, 1e3, micro), (1e9, 1e6, "ms"),
                             (600e9, 1e9, "s")):
        if value < limit:
            return f"{sign}{_sig(value / div)} {unit}"
    return f"{sign}{_sig(value / 60e9)} min"


def fmt_bytes(n: Any, style: Style) -> str:
    """Bytes in binary units: 512 B, 10.0 MiB, 1.25 GiB."""
    if is_missing(n):
        return "-"
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{sign}{int(value)} B" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def fmt_share(x: Any, style: Style) -> str:
    if is_missing(x):
        return "-"
    return f"{100 * float(x):.1f}%"


def fmt_count(x: Any, style: Style) -> str:
    if is_missing(x):
        return "-"
    return str(int(x))


def fmt_ratio(x: Any, style: Style) -> str:
    if is_missing(x):
        return "-"
    value = float(x)
    # A tiny request against a worker's whole RSS (Daft's 128 B at level 1) read as
    # '1880320.00x': three significant digits and a k or M say as much.
    if value >= 1e6:
        return f"{_sig(value / 1e6)}Mx"
    if value >= 1e3:
        return f"{_sig(value / 1e3)}kx"
    return f"{value:.2f}x"


def fmt_text(x: Any, style: Style) -> str:
    return "-" if is_missing(x) else str(x)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def fmt_name(name: Any, style: Style) -> str:
    """A name as a table's name column shows it (:func:`name_column`), for a sentence."""
    return _cell(fmt_text(name, style), NAME_WIDTH, style)


def _cell(text: str, limit: int | None, style: Style) -> str:
    """One line of at most ``limit`` characters: a newline or NUL in a name would cut
    the table's row in two (or the name, on a terminal), so they show escaped."""
    if _CONTROL.search(text):
        text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
    if limit is not None and len(text) > limit:
        # Cut in the middle: names end in what tells them apart (Ray Data's fused
        # operators 'Read...->MapBatches(f)->MapBatches(g)', a path's file name).
        more = "…" if style.rich else "..."
        room = limit - len(more)
        head = room * 2 // 5
        text = text[:head] + more + text[len(text) - (room - head):]
    return text


def _sig(value: float) -> str:
    """Three significant digits, no exponent."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


_BLOCKS = "▁▂▃▄▅▆▇█"
_ASCII = " .:-=+*#"


def sparkline(fractions: Sequence[float], style: Style) -> str:
    """Busy fractions (0..1, more is clamped) as one character each."""
    ramp = _BLOCKS if style.rich else _ASCII
    out = []
    for f in fractions:
        f = 0.0 if f is None or math.isnan(f) else min(max(f, 0.0), 1.0)
        out.append(ramp[min(int(f * len(ramp)), len(ramp) - 1)])
    return "".join(out)


def render_table(
    title: str | None,
    columns: Sequence[Column],
    rows: Sequence[dict[str, Any]],
    style: Style,
    *,
    empty: str = "(none)",
) -> str:
    """A table with a title line, a header, a rule and one line per row.

    Cells longer than their column's ``max_width`` are cut, and control
    characters show escaped.
    """
    cells = [
        [_cell((c.fmt or fmt_text)(row.get(c.key), style), c.max_width, style) for c in columns]
        for row in rows
    ]
    headers = [c.header for c in columns]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if c.right else v.ljust(w)
            for v, w, c in zip(values, widths, columns, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out: list[str] = []
    if title:
        out.append(style.bold(title))
    if not rows:
        out.append(f"  {empty}")
        return "\n".join(out)
    rule = "─" if style.rich else "-"
    out.append(style.bold(line(headers)))
    out.append(style.dim("  ".join(rule * w for w in widths)))
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def render_frame(frame: pd.DataFrame, style: Style) -> str:
    """Any query result as a table (values as they are, left-aligned text).

    The headers are the result's own, duplicates included; the rows are
    keyed by :func:`~tracer.query.unique_names`, so no column hides another.
    Values are shown whole (what a query asked for), control characters escaped.
    """
    import pandas as pd

    rows = records(frame)
    keys = unique_names(list(frame.columns))
    columns = [
        Column(str(name), key, right=pd.api.types.is_numeric_dtype(frame.iloc[:, i]))
        for i, (name, key) in enumerate(zip(frame.columns, keys, strict=True))
    ]
    return render_table(None, columns, rows, style, empty="(no rows)")


def render_csv(frame: pd.DataFrame) -> str:
    """The result as CSV: its own headers (duplicates included), every column's values."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([str(c) for c in frame.columns])
    for row in records(frame):
        writer.writerow(["" if v is None else v for v in row.values()])
    return buffer.getvalue()


def print_json(data: Any, stream: TextIO | None = None) -> None:
    """``data`` as JSON, written only once all of it could be encoded (no half a document
    on stdout before an error)."""
    text = json.dumps(data, indent=2, allow_nan=False, default=_json_default)
    out = stream or sys.stdout
    out.write(text)
    out.write("\n")


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"cannot write {type(value).__name__} as JSON")

"""Tracing levels, chosen by one environment variable or an argument.

Level 0 is the default so that a runner that has tracing calls compiled in
pays nothing for them until someone asks for a trace.
"""

from __future__ import annotations

import enum
import os

from tracer.errors import InvalidTracingLevelError

ENV_VAR = "TRACER_ENABLE_RAY_TRACING"


class TracingLevel(enum.IntEnum):
    """What a traced run records."""

    OFF = 0
    """Nothing: the runner gets a tracer whose calls do nothing."""
    TIMELINE = 1
    """Dispatch loop, tasks, nodes and workers, stages, counters; RSS per task."""
    MEMORY = 2
    """Level 1 plus every task under memray: heap peak, allocations, heap/RSS over time."""


_VALID = ", ".join(f"{lvl.value} ({lvl.name.lower()})" for lvl in TracingLevel)
#: The words every switch of tracer's takes (tracer._env): set as a switch, the level
#: variable means what a user setting it that way means, on (level 1) or off.
_SWITCH_WORDS = {"true": TracingLevel.TIMELINE, "yes": TracingLevel.TIMELINE,
                 "on": TracingLevel.TIMELINE, "false": TracingLevel.OFF, "no": TracingLevel.OFF}


def resolve_level(
    level: int | str | TracingLevel | None = None,
    *,
    default: TracingLevel = TracingLevel.OFF,
) -> TracingLevel:
    """The level to trace at: ``level`` if given, else ``$TRACER_ENABLE_RAY_TRACING``, else
    ``default`` (off: a library traces only when asked; a tool whose point is its trace,
    such as the examples, passes ``TracingLevel.TIMELINE`` and still yields to the
    environment's level).

    Accepts ints, digit strings, level names (``"timeline"``) and the words of tracer's
    switches (``true``/``yes``/``on``: 1, ``false``/``no``: 0); anything else raises
    :class:`~tracer.errors.InvalidTracingLevelError` naming the valid values.
    """
    source = "tracing level"
    if level is None:
        raw = os.environ.get(ENV_VAR, "").strip()
        if not raw:
            return TracingLevel(default)
        level, source = raw, f"${ENV_VAR}"
    if isinstance(level, bool):
        raise InvalidTracingLevelError(f"invalid {source} {level!r}; valid levels: {_VALID}")
    if isinstance(level, int):
        try:
            return TracingLevel(level)
        except ValueError:
            raise InvalidTracingLevelError(
                f"invalid {source} {level!r}; valid levels: {_VALID}"
            ) from None
    if isinstance(level, str):
        text = level.strip().lower()
        if text.isascii() and text.isdigit():  # not "²", a digit to str.isdigit
            return resolve_level(int(text)) if int(text) in (0, 1, 2) else _bad(source, level)
        for lvl in TracingLevel:
            if lvl.name.lower() == text:
                return lvl
        if text in _SWITCH_WORDS:
            return _SWITCH_WORDS[text]
        _bad(source, level)
    raise InvalidTracingLevelError(f"invalid {source} {level!r}; valid levels: {_VALID}")


def _bad(source: str, level: object) -> TracingLevel:
    raise InvalidTracingLevelError(f"invalid {source} {level!r}; valid levels: {_VALID}")

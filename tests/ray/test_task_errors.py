"""Reading what a task raised out of the text of its traceback (Ray's errors are text)."""

from __future__ import annotations

import pytest

from tracer.ray.task_errors import (
    exception_message,
    exceptions_in_traceback,
    raised_in_traceback,
)

_HEADER = "\x1b[36mray::f()\x1b[39m (pid=1, ip=10.0.0.1)\n"
_FRAME = '  File "/job.py", line 8, in f\n    raise exc("x")\n    ^^^^^^^^^^^^^^\n'
_CAUSE = "\n\nThe above exception was the direct cause of the following exception:\n\n"
_DURING = "\n\nDuring handling of the above exception, another exception occurred:\n\n"
_WRAPPER = "ray.exceptions.UserCodeException: UDF failed to process a data block.\n"


@pytest.mark.parametrize(("text", "raised"), [
    # A task's own exception, as Ray's error text ends.
    ("User exception:\n" + _HEADER + _FRAME + "ValueError: boom",
     ("ValueError", "ValueError: boom")),
    # A message of several lines: its first; a class alone.
    (_HEADER + _FRAME + "mymod.Outer.BadRecord: a\nsecond: line", ("BadRecord",
                                                                    "mymod.Outer.BadRecord: a")),
    (_HEADER + _FRAME + "BadRecord", ("BadRecord", "BadRecord")),
    # Raised from another, or while handling one: the one raised last.
    (_HEADER + _FRAME + "KeyError: 1" + _CAUSE + _HEADER + _FRAME + "RuntimeError: no key",
     ("RuntimeError", "RuntimeError: no key")),
    (_HEADER + _FRAME + "KeyError: 1" + _DURING + _HEADER + _FRAME + "RuntimeError: x",
     ("RuntimeError", "RuntimeError: x")),
    # Ray Data's wrapper (no frames of its own): what it wraps.
    (_HEADER + _FRAME + "ValueError: no 7 here" + _CAUSE + _HEADER + _WRAPPER
     + "To change retry attempts: configure `DataContext`\n",
     ("ValueError", "ValueError: no 7 here")),
    # Cut before the wrapped exception (Ray 2.55 keeps the text's last ~500 characters).
    ("User exception:\n_\n    res = self._fn(batch)\n" + _FRAME + _WRAPPER,
     ("UserCodeException", _WRAPPER.strip())),
    # Cut with no frame or header left to say where the exception's line is.
    ("User exception:\n_\n    res = self._fn(batch)\n" + _WRAPPER, None),
    # Not a traceback: Ray's reports of a killed worker, a cut-off head.
    ("Task was killed due to the node running low on memory.\nMemory on the node", None),
    ("RayTaskError(ValueError): bad", None),
    ("", None),
])
def test_the_exception_a_task_raised_is_read_out_of_its_traceback(
    text: str, raised: tuple[str, str] | None
) -> None:
    assert raised_in_traceback(text) == raised


def test_every_exception_of_a_chain_innermost_first() -> None:
    text = (_HEADER + _FRAME + "KeyError: 1" + _DURING + _FRAME + "ValueError: v" + _CAUSE
            + _HEADER + _WRAPPER)
    assert [t for t, _ in exceptions_in_traceback(text)] == [
        "KeyError", "ValueError", "UserCodeException"]


def test_an_exception_s_message_beside_its_type() -> None:
    assert exception_message("mymod.BadRecord: record 5: bad", "BadRecord") == "record 5: bad"
    assert exception_message("ValueError: x", "ValueError") == "x"
    assert exception_message("BadRecord", "BadRecord") == ""
    assert exception_message("Task was killed: OOM", "OutOfMemoryError") == (
        "Task was killed: OOM")

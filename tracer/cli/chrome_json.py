"""Reading a Chrome trace JSON one event at a time, in bounded memory.

A Chrome trace is a JSON array of events, or an object whose
``traceEvents`` member is that array (``ray timeline`` and ``ray.timeline()``
write the first). A timeline of a big Ray job is gigabytes: it is read in
chunks, and each event is parsed on its own by the standard library's C
decoder (``JSONDecoder.raw_decode``), so memory holds a chunk and one event,
whatever the file's size (an event is at most ``MAX_EVENT_CHARS``). No
dependency: an incremental parser such as ijson would do the same with a C
backend to install, for the one shape of document this needs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

from tracer.errors import TracerError

__all__ = ["ChromeJsonError", "iter_events"]

_CHUNK = 1 << 20
#: A value still unparsed at this size is taken as broken JSON, not read on: the
#: bound on memory (Ray's events are a few hundred bytes).
MAX_EVENT_CHARS = 64 << 20
_WS = " \t\r\n"


class ChromeJsonError(TracerError):
    """The input is not a Chrome trace JSON (or not valid JSON)."""


class _Stream:
    """A text stream read in chunks, with a cursor over what is held."""

    def __init__(self, f: IO[str], name: str) -> None:
        self.f = f
        self.name = name
        self.buf = ""
        self.pos = 0
        self.offset = 0  # characters of the file before buf[0]
        self.eof = False

    def more(self) -> bool:
        """Read another chunk (dropping what was consumed); False at the end of the file."""
        if self.eof:
            return False
        chunk = self.f.read(_CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.offset += self.pos
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character that is not white space ('' at the end)."""
        while True:
            buf, pos = self.buf, self.pos
            while pos < len(buf) and buf[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self.more():
                return ""

    def expect(self, char: str, what: str) -> None:
        found = self.peek()
        if found != char:
            self.fail(f"expected {what}, found {_show(found)}")
        self.pos += 1

    def value(self, decoder: json.JSONDecoder) -> Any:
        """The next JSON value, read on until it is whole."""
        self.peek()
        while True:
            try:
                value, end = decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                # Cut off at the chunk's end, or wrong: read on, up to the end of the file
                # or MAX_EVENT_CHARS (then it is wrong).
                if len(self.buf) - self.pos < MAX_EVENT_CHARS and self.more():
                    continue
                if self.eof and _ends_inside(self.buf, exc):
                    self.fail(
                        "the file ends in the middle of an event (cut short while being "
                        "written or copied?)", self.offset + self.pos,
                    )
                self.fail(f"invalid JSON: {exc.msg}", self.offset + exc.pos)
            if end == len(self.buf) and not self.eof and self.more():
                continue  # a number may go on in the next chunk: parse it again whole
            self.pos = end
            return value

    def fail(self, message: str, at: int | None = None) -> None:
        where = self.offset + self.pos if at is None else at
        raise ChromeJsonError(f"{self.name}: {message} (at character {where})")


def _ends_inside(buf: str, exc: json.JSONDecodeError) -> bool:
    """Whether the decoder failed because the text stopped, not because it is wrong."""
    end = len(buf.rstrip())
    if exc.pos >= end:
        return True  # it wanted more: a value, a delimiter, a name
    # A string that runs to the end of the file.
    return exc.msg.startswith("Unterminated string") and '"' not in buf[exc.pos + 1 : end]


def _show(char: str) -> str:
    return "the end of the file" if not char else repr(char)


def iter_events(f: IO[str], name: str) -> Iterator[dict[str, Any]]:
    """The events of a Chrome trace JSON, one at a time; raises :class:`ChromeJsonError`."""
    s = _Stream(f, name)
    decoder = json.JSONDecoder()
    first = s.peek()
    if first == "[":
        yield from _array(s, decoder)
    elif first == "{":
        yield from _object(s, decoder)
    elif not first:
        what = "is empty" if s.offset + s.pos == 0 else "holds nothing but white space"
        raise ChromeJsonError(f"{name}: the file {what}: there are no events to convert")
    else:
        s.fail(
            "not a Chrome trace JSON (a list of events, or an object with 'traceEvents'): "
            f"it starts with {_show(first)}"
        )
    if s.peek():
        s.fail("unexpected data after the trace")


def _array(s: _Stream, decoder: json.JSONDecoder) -> Iterator[dict[str, Any]]:
    s.expect("[", "'['")
    if s.peek() == "]":
        s.pos += 1
        return
    while True:
        at = s.offset + s.pos
        event = s.value(decoder)
        if not isinstance(event, dict):
            s.fail(f"an event is not a JSON object but {type(event).__name__}", at)
        yield event
        sep = s.peek()
        if sep == ",":
            s.pos += 1
        elif sep == "]":
            s.pos += 1
            return
        else:
            s.fail(f"expected ',' or ']' after an event, found {_show(sep)}")


def _object(s: _Stream, decoder: json.JSONDecoder) -> Iterator[dict[str, Any]]:
    s.expect("{", "'{'")
    found = False
    if s.peek() == "}":
        s.pos += 1
    else:
        while True:
            if s.peek() != '"':
                s.fail(f"expected a member name, found {_show(s.peek())}")
            key = s.value(decoder)
            s.expect(":", "':'")
            if key == "traceEvents":
                if s.peek() != "[":
                    s.fail("'traceEvents' is not a list")
                found = True
                yield from _array(s, decoder)
            else:
                s.value(decoder)  # metadata: skipped (a member is small, or read whole)
            sep = s.peek()
            if sep == ",":
                s.pos += 1
            elif sep == "}":
                s.pos += 1
                break
            else:
                s.fail(f"expected ',' or '}}' in the object, found {_show(sep)}")
    if not found:
        s.fail("not a Chrome trace JSON: the object has no 'traceEvents'")

"""Ray's ``GetTaskEvents`` reply read from its bytes: a task's entry parsed only if wanted.

A read of a job's events brings every task attempt Ray holds of the job,
~900 bytes each (a 20,000-task run: 17 MiB). Parsed whole, the reply took
three times its bytes in the driver at once (protobuf's objects), and the
facts made of it as much again: the driver of a 20k-task run peaked ~150
MiB higher with Ray's events read than without. Here the reply stays bytes:
each task's entry is found by its length prefix, its task id and attempt
are read off its own fields, and only the entries of tasks still wanted are
parsed, by Ray's own protobuf classes, a batch at a time, so that no more
than a batch of them is ever parsed at once.

The field numbers come from Ray's descriptors, not from here. Bytes that do
not follow the wire format raise :class:`ValueError`: the caller then parses
the reply whole, as protobuf would have, which says what is wrong with it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["RawTaskEvents", "is_raw", "parse_entries", "split_reply", "task_key"]

#: Entries parsed at once (~3 KB each parsed: a batch is ~1.5 MB).
_BATCH = 512
_LEN = 2  # the wire type of length-delimited fields
_U64 = 1 << 64


#: One task attempt's entry in a reply, not parsed: ``(task id, attempt, the reply's
#: bytes, start, end)``, where ``data[start:end]`` is the entry.
#:
#: A tuple of atoms, not an object with attributes: a read of a job holds one per task
#: attempt Ray sent (tens of thousands), through the collections of the cycle
#: collector that the read's allocations set off. An object of a class was carried
#: into the oldest generation by each of them, and those carried over are what sets
#: off a full collection (each walking the driver's whole heap, ~50-70 ms with Ray
#: loaded): a level-1 driver ran three per 10,000 no-op tasks. The collector
#: untracks a tuple of atoms the first time it sees one, so it carries none over.
RawTaskEvents = tuple[bytes, int, bytes, int, int]


def is_raw(ev: Any) -> bool:
    """Is ``ev`` an entry not parsed yet (else it is Ray's parsed ``TaskEvents``)?"""
    return type(ev) is tuple


def task_key(ev: Any) -> tuple[bytes, int]:
    """(task id, attempt number) of an entry, parsed or not."""
    if type(ev) is tuple:
        return ev[0], ev[1]
    return ev.task_id, ev.attempt_number


@functools.cache
def _numbers() -> tuple[int, int, int]:
    """(the reply's task entries, an entry's task id, its attempt): field numbers."""
    from ray.core.generated import gcs_pb2
    from ray.core.generated import gcs_service_pb2 as gs

    entry = gcs_pb2.TaskEvents.DESCRIPTOR.fields_by_name
    return (
        gs.GetTaskEventsReply.DESCRIPTOR.fields_by_name["events_by_task"].number,
        entry["task_id"].number,
        entry["attempt_number"].number,
    )


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + 1
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def _skip(data: bytes, pos: int, wire_type: int) -> int:
    """The position after a field's value of this wire type, starting at ``pos``."""
    if wire_type == 0:
        return _varint(data, pos)[1]
    if wire_type == _LEN:
        length, pos = _varint(data, pos)
        return pos + length
    if wire_type == 1:
        return pos + 8
    if wire_type == 5:
        return pos + 4
    raise ValueError(f"wire type {wire_type}")


def split_reply(data: bytes) -> tuple[Any, list[RawTaskEvents]]:
    """The reply's other fields (a parsed ``GetTaskEventsReply`` without its entries)
    and its task entries, not parsed. ``ValueError`` when the bytes are not a reply."""
    from ray.core.generated import gcs_service_pb2 as gs

    entries_field, id_field, attempt_field = _numbers()
    entry_tag = (entries_field << 3) | _LEN
    id_tag = (id_field << 3) | _LEN
    attempt_tag = attempt_field << 3
    if max(entry_tag, id_tag, attempt_tag) >= 0x80:  # (one byte each in Ray 2.60)
        raise ValueError("field numbers this reader does not expect")
    rest = bytearray()
    entries: list[RawTaskEvents] = []
    append = entries.append
    end = len(data)
    pos = 0
    try:
        while pos < end:
            start = pos
            tag, pos = _varint(data, pos)
            if tag == entry_tag:
                length, pos = _varint(data, pos)
                stop = pos + length
                if stop > end:
                    raise ValueError("an entry runs past the reply's end")
                # This runs for every task Ray sends. The common entry, spelled out: its
                # task id first, then its attempt or (attempt 0, which protobuf leaves
                # out) a later field, as protobuf writes them, in field order.
                n = data[pos + 1]
                after = pos + 2 + n
                if data[pos] == id_tag and n < 0x80 and after < stop:
                    task_id = data[pos + 2:after]
                    tag = data[after]
                    if tag == attempt_tag and data[after + 1] < 0x80:
                        attempt = data[after + 1]
                    elif tag < 0x80 and tag >> 3 > attempt_field:
                        attempt = 0
                    else:
                        task_id, attempt = _peek(data, pos, stop, id_field, attempt_field)
                else:
                    task_id, attempt = _peek(data, pos, stop, id_field, attempt_field)
                append((task_id, attempt, data, pos, stop))
                pos = stop
            else:
                pos = _skip(data, pos, tag & 7)
                rest += data[start:pos]
    except IndexError:
        raise ValueError("the reply ends inside a field") from None
    if pos != end:
        raise ValueError("the reply's last field runs past its end")
    return gs.GetTaskEventsReply.FromString(bytes(rest)), entries


def _peek(data: bytes, pos: int, end: int, id_field: int, attempt_field: int) -> tuple[bytes, int]:
    """An entry's task id and attempt number, read off its top-level fields."""
    task_id = b""
    attempt = 0
    while pos < end:
        tag, pos = _varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == id_field and wire_type == _LEN:
            length, pos = _varint(data, pos)
            task_id = data[pos:pos + length]
            pos += length
        elif number == attempt_field and wire_type == 0:
            attempt, pos = _varint(data, pos)
            if attempt >= 1 << 63:  # a negative int32, as protobuf writes it
                attempt -= _U64
        else:
            pos = _skip(data, pos, wire_type)
    if pos != end:
        raise ValueError("an entry's last field runs past its end")
    return task_id, attempt


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def parse_entries(entries: Sequence[RawTaskEvents]) -> Iterator[Any]:
    """The ``TaskEvents`` of these entries, in their order, parsed a batch at a time.

    A batch is parsed as one reply made of its entries: one call into
    protobuf per batch (parsing each entry alone cost ~60% more).
    """
    if not entries:
        return
    from ray.core.generated import gcs_service_pb2 as gs

    tag = _varint_bytes((_numbers()[0] << 3) | _LEN)
    for first in range(0, len(entries), _BATCH):
        parts: list[bytes] = []
        # Slices copied (~900 bytes each), not memoryviews: two objects of the cycle
        # collector's each, a batch of them alive through its collections.
        for _, _, data, start, end in entries[first:first + _BATCH]:
            parts += (tag, _varint_bytes(end - start), data[start:end])
        yield from gs.GetTaskEventsReply.FromString(b"".join(parts)).events_by_task

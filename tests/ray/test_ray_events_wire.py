"""Ray's GetTaskEvents reply read from its bytes (tracer.ray.ray_events_wire).

Replies are built and serialized with Ray's own protobuf classes; what the
reader makes of the bytes must be what protobuf makes of them, entry by
entry, with only the wanted entries parsed.
"""

from __future__ import annotations

import gc
import random
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from ray.core.generated import gcs_pb2
from ray.core.generated import gcs_service_pb2 as gs

from tracer.ray import ray_events_wire as wire
from tracer.ray.ray_events import _reply_of
from tracer.ray.ray_events_facts import to_facts


def _event(rng: random.Random, i: int) -> Any:
    ev = gcs_pb2.TaskEvents(task_id=i.to_bytes(24, "big"), job_id=b"\x01\x00\x00\x00")
    ev.attempt_number = rng.choice([0, 0, 1, 3, 200, 70000])  # 200+: a varint of 2+ bytes
    if rng.random() < 0.8:
        ev.task_info.name = rng.choice(["inc", "a" * 300])  # a long name: a 2-byte length
        ev.task_info.required_resources["CPU"] = 1.0
    updates = ev.state_updates
    updates.node_id = bytes([i % 256]) * 28
    updates.worker_pid = 1000 + i
    for status in rng.sample([1, 2, 5, 8, 11], rng.randint(0, 5)):
        updates.state_ts_ns[status] = 1_700_000_000_000_000_000 + rng.randrange(10**9)
    for name in rng.sample(["task::inc", "task:execute", "task:store_outputs"], 2):
        start = 1_700_000_000_000_000_000 + rng.randrange(10**9)
        ev.profile_events.events.add(event_name=name, start_time=start, end_time=start + 5)
    return ev


def _reply(events: list[Any], **counts: int) -> Any:
    reply = gs.GetTaskEventsReply(**counts)
    reply.events_by_task.extend(events)
    return reply


def test_the_entries_are_protobufs_own_and_only_the_wanted_are_parsed() -> None:
    rng = random.Random(7)
    events = [_event(rng, i) for i in range(1300)]  # more than two batches
    reply = _reply(events, num_profile_task_events_dropped=3, num_status_task_events_dropped=4,
                   num_total_stored=1500, num_truncated=200)
    data = reply.SerializeToString()
    header, entries = wire.split_reply(data)
    assert (header.num_total_stored, header.num_truncated) == (1500, 200)
    assert not header.events_by_task
    assert all(wire.is_raw(e) for e in entries)
    assert [wire.task_key(e) for e in entries] == [
        (ev.task_id, ev.attempt_number) for ev in events
    ]
    assert list(wire.parse_entries(entries)) == events
    read = _reply_of(data)
    assert (read.dropped, read.stored, read.truncated) == (7, 1500, 200)
    wanted = {ev.task_id.hex() for ev in events[::3]}
    assert to_facts(read.events, wanted) == to_facts(events, wanted)
    assert len(to_facts(read.events, wanted)) == len(wanted)


def test_the_cycle_collector_does_not_keep_walking_the_entries() -> None:
    """A read of a job holds an entry per task attempt Ray sent, through the collections
    its allocations set off: the collector must drop them from its lists at the first,
    or they are carried into its oldest generation and set off full collections."""
    rng = random.Random(5)
    _, entries = wire.split_reply(_reply([_event(rng, i) for i in range(50)]).SerializeToString())
    gc.collect()
    assert len(entries) == 50
    assert not any(gc.is_tracked(e) for e in entries)


def test_fields_in_any_order_and_unknown_ones_are_read_the_same() -> None:
    """protobuf writes fields in number order, but a reader must take any order; a field
    this Ray's schema does not know (a newer Ray's) is skipped."""
    ev = gcs_pb2.TaskEvents(task_id=b"\x05" * 24, attempt_number=2)
    ev.task_info.name = "inc"
    # attempt (field 2) before task id (field 1), then an unknown field 99 (varint 7)
    swapped = (
        gcs_pb2.TaskEvents(attempt_number=2).SerializeToString()
        + gcs_pb2.TaskEvents(task_id=b"\x05" * 24).SerializeToString()
        + bytes([0x98, 0x06, 0x07])
        + gcs_pb2.TaskEvents(task_info=ev.task_info).SerializeToString()
    )
    data = bytes([0x12, len(swapped)]) + swapped
    _, (entry,) = wire.split_reply(data)
    assert wire.task_key(entry) == (b"\x05" * 24, 2)
    (parsed,) = wire.parse_entries([entry])
    assert (parsed.task_id, parsed.attempt_number, parsed.task_info.name) == (
        b"\x05" * 24, 2, "inc",
    )


@pytest.mark.parametrize("cut", [1, 2, 40, -1])
def test_bytes_that_are_no_reply_are_parsed_whole_and_fail_as_protobuf_says(cut: int) -> None:
    """A reply cut short is not split: it is handed to protobuf, which raises its own
    error (the read then drops this source, as before)."""
    rng = random.Random(3)
    data = _reply([_event(rng, i) for i in range(3)]).SerializeToString()[:cut]
    with pytest.raises(ValueError):
        wire.split_reply(data)
    with pytest.raises(DecodeError):
        _reply_of(data)


def test_an_empty_reply_has_no_entries() -> None:
    header, entries = wire.split_reply(b"")
    assert entries == [] and header.num_total_stored == 0
    assert list(wire.parse_entries([])) == []

"""Recent reads of Ray's events: a long-lived driver reads its new tasks, not its job's past.

A read of the job sends every task the job ever ran (Ray's filters cannot say
"since"); a driver that already ran 30,000 tasks paid for all of them at each
run's close. A recent read (``GcsQuery.recent``) asks Ray for the tasks that
finished last, as many as are wanted. These tests run on a real Ray; the
rules for how deep a read must go are also checked on Ray's own protobufs laid
out as Ray's GCS keeps them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from ray_jobs import job_id, task_ids
from ray_trace_checks import load

from tracer.ray import layout as L
from tracer.ray.ray_events import GcsQuery, RayEventSource, Reply
from tracer.runner import Pipeline, Stage


class _Recorded:
    """The real GCS query, recording each query asked of it and how many tasks it sent."""

    name = "gcs"

    def __init__(self, gcs: GcsQuery) -> None:
        self._gcs = gcs
        self.calls: list[tuple[str, int]] = []
        self.limits: list[int] = []  # of each recent read

    def job(self, job_id: bytes, timeout: float) -> Reply:
        reply = self._gcs.job(job_id, timeout)
        self.calls.append(("job", len(reply.events)))
        return reply

    def task(self, task_id: bytes, timeout: float) -> Reply:
        reply = self._gcs.task(task_id, timeout)
        self.calls.append(("task", len(reply.events)))
        return reply

    def recent(self, limit: int, timeout: float) -> Reply:
        self.limits.append(limit)
        reply = self._gcs.recent(limit, timeout)
        self.calls.append(("recent", len(reply.events)))
        return reply

    def close(self) -> None:
        pass  # the test closes its GcsQuery


def _until_ray_has(source: RayEventSource, ids: list[str]) -> None:
    """Wait until Ray has every event of these tasks (read one task at a time)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        facts = source.read_each(ids)
        if sum(1 for f in facts if f.span is not None and f.ended) == len(ids):
            return
        time.sleep(0.1)
    raise AssertionError("Ray's events did not come")


def test_a_later_run_of_the_job_reads_the_tasks_that_finished_last(
    ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    from tracer.ray import ray_events

    monkeypatch.setattr(ray_events, "_MEASURED", {})
    gcs = GcsQuery(ray.get_runtime_context().gcs_address)
    try:
        history = task_ids(800)
        first = _Recorded(gcs)
        source = RayEventSource(job_id(), [first])
        _until_ray_has(source, history[-4:])
        by_job = {f.ray_task_id: f for f in source.read(history)}
        assert [c[0] for c in first.calls if c[0] != "task"] == ["job"]
        assert set(by_job) == set(history)
        held = source.stored
        assert held >= 800

        # The next run's source of the same job: 20 new tasks, a job that holds 820+.
        new = task_ids(20)
        later = _Recorded(gcs)
        source = RayEventSource(job_id(), [later])
        _until_ray_has(source, new[-4:])
        later.calls.clear()
        facts = {f.ray_task_id: f for f in source.read(new)}
        assert set(facts) == set(new)
        (call,) = later.calls
        assert call[0] == "recent" and call[1] <= 20 + 64 < held, call
        # The same facts a read of the job gives.
        again = RayEventSource(job_id(), [_Recorded(gcs)])
        again._read_job = True
        assert {f.ray_task_id: f for f in again.read(new)} == facts

        # A task the recent read cannot reach: left for later, or, when Ray should have
        # everything (the close), found by a read of the job.
        old = history[0]
        later.calls.clear()
        source._one_task_s = 1.0  # how deep a recent read goes, not whether one is chosen
        assert {f.ray_task_id for f in source.read([*new, old])} == set(new)
        assert [c[0] for c in later.calls] == ["recent"]
        # Three tries reach at most ~8x the first limit (~840 with doubling, or less):
        # the old task is 800+ deep, and deeper by what earlier tests ran in this Ray,
        # so with fewer tries than that the job read is certain whatever ran before.
        monkeypatch.setattr(ray_events, "_RECENT_TRIES", 3)
        later.calls.clear()
        later.limits.clear()
        found = {f.ray_task_id for f in source.read([*new, old], complete=True)}
        assert found == {*new, old}
        # Twice as deep each time, a few times (it is 800 tasks down), then the job.
        kinds = [c[0] for c in later.calls]
        assert kinds == ["recent"] * 3 + ["job"], kinds
        first_limit = later.limits[0]
        assert later.limits == [first_limit, 2 * first_limit, 4 * first_limit], later.limits
        assert 4 * first_limit < 800, later.limits
        # And once the job was read, the source keeps reading the job.
        source._one_task_s = 1.0  # (not one query per task)
        later.calls.clear()
        source.read(new)
        assert [c[0] for c in later.calls] == ["job"]
    finally:
        gcs.close()


def _noop(x: int) -> int:
    return x


def test_a_long_lived_drivers_second_run_reads_its_own_tasks_only(
    ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs in one driver: the second run's trace has Ray's phases for every one of
    its executions, read without reading the job (whose first run it would send again)."""
    from tracer.ray import ray_events

    monkeypatch.setattr(ray_events, "_MEASURED", {})
    sent: list[tuple[str, int]] = []
    job, recent = GcsQuery.job, GcsQuery.recent

    def job_read(self: GcsQuery, job_id: bytes, timeout: float) -> Reply:
        reply = job(self, job_id, timeout)
        sent.append(("job", len(reply.events)))
        return reply

    def recent_read(self: GcsQuery, limit: int, timeout: float) -> Reply:
        reply = recent(self, limit, timeout)
        sent.append(("recent", len(reply.events)))
        return reply

    monkeypatch.setattr(GcsQuery, "job", job_read)
    monkeypatch.setattr(GcsQuery, "recent", recent_read)
    n = 40
    for run in ("first", "second"):
        sent.clear()
        path = tmp_path / f"{run}.perfetto-trace"
        Pipeline(list(range(n)), [Stage("noop", _noop)]).run(
            tracing_level=1, trace_path=path, progress=False
        )
        model = load(path)
    kinds = {kind for kind, _ in sent}
    assert kinds == {"recent"}, sent
    assert sum(count for _, count in sent) <= 3 * n, sent
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    spans = [s for s in model.slices if (s.name or "").startswith(L.RAY_TASK_PREFIX)]
    assert len(executions) == n and len(spans) == n
    (read,) = [i for i in model.instants if i.name == L.INSTANT_RAY_EVENTS]
    assert read.args.get(L.ARG_RAY_EVENTS_MISSING, 0) == 0, read.args


# How deep a recent read goes, on Ray's own TaskEvents laid out as its GCS keeps them.


class _Storage:
    """Ray's finished tasks newest first, as its GCS sends them to a recent query."""

    name = "gcs"

    def __init__(self) -> None:
        self.events: list[Any] = []  # newest first
        self.limits: list[int] = []

    def finish(self, task_id: bytes, complete: bool = True) -> Any:
        from ray.core.generated import gcs_pb2

        ev = gcs_pb2.TaskEvents(task_id=task_id, attempt_number=0)
        ev.state_updates.state_ts_ns[11] = 2_000  # FINISHED
        if complete:
            self.add_worker_events(ev)
        self.events.insert(0, ev)
        return ev

    @staticmethod
    def add_worker_events(ev: Any) -> None:
        ev.profile_events.events.add(event_name="task::noop", start_time=1_000, end_time=1_500)

    def recent(self, limit: int, timeout: float) -> Reply:
        self.limits.append(limit)
        sent = [type(ev).FromString(ev.SerializeToString()) for ev in self.events[:limit]]
        return Reply(sent, 0, len(self.events), max(0, len(self.events) - limit))

    def job(self, job_id: bytes, timeout: float) -> Reply:
        raise AssertionError("a recent read was enough")

    task = job

    def close(self) -> None:
        pass


#: Not a job of the session's Ray (its first job is 01000000): nothing measured of it.
_FAKE_JOB = "7f000000"


@pytest.fixture(autouse=True)
def _nothing_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from no earlier source's measurements (they are kept by job)."""
    from tracer.ray import ray_events

    monkeypatch.setattr(ray_events, "_MEASURED", {})


def _tid(i: int) -> bytes:
    return i.to_bytes(24, "big")


def test_a_task_found_without_its_workers_events_is_found_again_deeper() -> None:
    """A task whose end reached Ray before its worker's events stays where its end put
    it; tasks that finish later go in front. The next read goes as deep as it now is,
    not deeper, and not the whole storage."""
    storage = _Storage()
    for i in range(1000):  # the job's past
        storage.finish(_tid(i))
    source = RayEventSource(_FAKE_JOB, [storage])
    source.stored = 1000
    source._one_task_s = 1.0  # how deep a recent read goes, not whether one is chosen
    first = [_tid(1000 + i) for i in range(100)]
    late = storage.finish(first[0], complete=False)  # its worker has not reported yet
    for task_id in first[1:]:
        storage.finish(task_id)
    wanted = [t.hex() for t in first]
    facts = source.read(wanted)
    assert len(facts) == 100 and storage.limits == [100 + 64]
    # The run's timeline drew the 99 complete ones; the first is still wanted. 300 more
    # tasks finish, then the late one's worker reports (it stays where it was).
    second = [_tid(2000 + i) for i in range(300)]
    for task_id in second:
        storage.finish(task_id)
    storage.add_worker_events(late)
    storage.limits.clear()
    wanted = [first[0].hex()] + [t.hex() for t in second]
    facts = source.read(wanted)
    by_id = {f.ray_task_id: f for f in facts}
    assert set(by_id) == set(wanted)
    assert by_id[first[0].hex()].span == (1_000, 1_500)
    # It is now at 300 + 99: one query, as deep as that and no deeper than the slack.
    (limit,) = storage.limits
    assert 300 + 99 + 1 <= limit <= 300 + 99 + 1 + 64, limit


def test_a_read_whose_limit_falls_short_of_the_last_front_goes_deeper() -> None:
    """More tasks finished since the last read than the read asked for (another job's,
    say): the last read's first task is past the limit, and the read asks again."""
    storage = _Storage()
    source = RayEventSource(_FAKE_JOB, [storage])
    source.stored = 1000
    # How deep a recent read goes, not whether one is chosen: else, once the first read
    # was timed slower than one task's query, the one straggler is asked for by its id.
    source._one_task_s = 1.0
    for i in range(1000):
        storage.finish(_tid(i))
    straggler = storage.finish(_tid(5000), complete=False)
    for i in range(10):
        storage.finish(_tid(6000 + i))
    source.read([_tid(5000).hex()] + [_tid(6000 + i).hex() for i in range(10)])
    for i in range(2000):  # another job's tasks
        storage.finish(_tid(10_000 + i))
    storage.add_worker_events(straggler)
    storage.limits.clear()
    facts = source.read([_tid(5000).hex()])
    assert [f.ray_task_id for f in facts] == [_tid(5000).hex()]
    assert len(storage.limits) <= 4 and storage.limits[-1] >= 2000 + 10 + 1


def test_a_job_that_is_a_small_part_of_what_ray_holds_is_read_as_a_job() -> None:
    """A recent read has Ray's GCS copy every task it holds, of every job: on a cluster
    whose other jobs hold far more than this one, a read of the job costs less."""

    class _Jobs(_Storage):
        def __init__(self) -> None:
            super().__init__()
            self.job_reads = 0

        def job(self, job_id: bytes, timeout: float) -> Reply:
            self.job_reads += 1
            return Reply(list(self.events), 0, len(self.events))

    storage = _Jobs()
    for i in range(50):
        storage.finish(_tid(i))
    wanted = [_tid(i).hex() for i in range(50)]
    source = RayEventSource(_FAKE_JOB, [storage])
    source.stored, source.held = 500, 1000  # this job holds half of what Ray holds
    source._one_task_s = 1.0
    assert len(source.read(wanted)) == 50 and storage.limits and not storage.job_reads
    source = RayEventSource(_FAKE_JOB, [storage])
    source.stored, source.held = 500, 5000  # a tenth
    source._one_task_s = 1.0
    assert len(source.read(wanted)) == 50 and storage.job_reads == 1


def test_a_recent_read_that_fails_leaves_the_job_read_not_the_source() -> None:
    """A Ray whose GCS rejects the recent query (no limit, say) is read by its job, and the
    GCS source stays: the read of every job's events, the next source, costs far more."""

    class _NoRecent(_Storage):
        def recent(self, limit: int, timeout: float) -> Reply:
            raise RuntimeError("task events query rejected: limit")

        def job(self, job_id: bytes, timeout: float) -> Reply:
            return Reply(list(self.events), 0, len(self.events))

    storage = _NoRecent()
    for i in range(20):
        storage.finish(_tid(i))
    source = RayEventSource(_FAKE_JOB, [storage])
    source.stored, source._one_task_s = 500, 1.0
    assert len(source.read([_tid(i).hex() for i in range(20)])) == 20
    assert source.name == "gcs" and source._read_job

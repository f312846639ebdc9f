"""Ray's own task events in the trace, on a real Ray: phases, states, sources, what is missing."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ray_jobs import job_id, task_ids
from ray_trace_checks import load
from trace_bytes import uncompressed

from tracer.format.model import Slice, TraceModel
from tracer.ray import layout as L
from tracer.ray.ray_events import AllEventsQuery, GcsQuery, RayEventSource, Reply
from tracer.ray.ray_events_wire import is_raw
from tracer.runner import Pipeline, Stage

NUM_PARTITIONS = 6


def _inc(x: int) -> int:
    time.sleep(0.01)
    return x + 1


def _neg(x: int) -> int:
    return -x


@pytest.fixture(scope="module")
def run(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> TraceModel:
    path = tmp_path_factory.mktemp("rayev") / "run.perfetto-trace"
    Pipeline(list(range(NUM_PARTITIONS)), [Stage("inc", _inc), Stage("neg", _neg)]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    return load(path)


def _run_slice(model: TraceModel) -> Slice:
    return next(s for s in model.slices if s.category == L.CAT_SCHEDULER and s.depth == 0)


def _counts(model: TraceModel) -> dict[str, Any]:
    """What the run says of Ray's events it lacks (once they were read: after the run)."""
    (read,) = [i for i in model.instants if i.name == L.INSTANT_RAY_EVENTS]
    return dict(read.args)


def test_every_execution_has_rays_phases_nested_on_its_worker(run: TraceModel) -> None:
    executions = [s for s in run.slices if s.category == L.CAT_EXECUTION]
    assert len(executions) == 2 * NUM_PARTITIONS
    spans = {s.args[L.ARG_TASK_ID]: s for s in run.slices
             if s.category == L.CAT_RAY and (s.name or "").startswith(L.RAY_TASK_PREFIX)}
    assert set(spans) == {e.args[L.ARG_TASK_ID] for e in executions}
    for e in executions:
        span = spans[e.args[L.ARG_TASK_ID]]
        # Ray's task id once per task, on the execution (the events were matched by it).
        assert e.args[L.ARG_RAY_TASK_ID] and L.ARG_RAY_TASK_ID not in span.args
        assert span.name == L.RAY_TASK_PREFIX + e.name  # the runner names its calls by stage
        # On a 'Ray phases' track under the very worker the execution was measured on.
        assert run.tracks[span.track_uuid].name == L.RAY_PHASES_TRACK
        assert run.tracks[span.track_uuid].parent_uuid == e.track_uuid
        phases = sorted((s for s in run.slices if s.parent_id == span.id), key=lambda s: s.ts)
        assert [p.name for p in phases] == [
            L.PHASE_DESERIALIZE, L.PHASE_EXECUTE, L.PHASE_STORE_OUTPUTS]
        execute = phases[1]
        # Ray's execute phase runs the traced call, which measured the execution inside it.
        assert execute.ts <= e.ts and e.end_ts is not None and e.end_ts <= execute.end_ts
    # A worker runs one task at a time: one lane of Ray's phases each. (The close drew
    # each worker's last task first, its earlier ones then on a second lane.)
    lanes = Counter(run.tracks[s.track_uuid].parent_uuid for s in spans.values())
    for worker, _ in lanes.items():
        assert [t.name for t in run.children(worker) if t.kind == "track"] == [
            L.RAY_PHASES_TRACK], run.tracks[worker]
    assert _counts(run)[L.ARG_RAY_EVENTS_MISSING] == 0
    assert _counts(run)[L.ARG_RAY_EVENTS_SOURCE] == "gcs"


def test_rays_states_split_each_dispatched_slice(run: TraceModel) -> None:
    """Each task's states, one after the other, in a 'ray states <stage>' slice that names
    the task and spans its 'dispatched' slice, on 'Ray states' lanes beside the tasks' lanes
    (one name: the UI merges them into one track, not a track under each lane)."""
    order = [L.STATE_PENDING_ARGS, L.STATE_PENDING_NODE, L.STATE_SUBMITTED, L.STATE_RUNNING,
             L.STATE_FINISHED]
    dispatched = [s for s in run.slices if s.name == L.SLICE_DISPATCHED]
    assert len(dispatched) == 2 * NUM_PARTITIONS
    by_task = {d.parent_id: d for d in dispatched}
    tasks = {s.args[L.ARG_TASK_ID]: s for s in run.slices
             if s.category == L.CAT_TASK and s.depth == 0}
    heads = [s for s in run.slices if (s.name or "").startswith(L.RAY_STATES_PREFIX)]
    assert len(heads) == len(dispatched)
    lanes_root = {run.tracks[d.track_uuid].parent_uuid for d in dispatched}
    assert {run.tracks[h.track_uuid].parent_uuid for h in heads} == lanes_root
    assert not [t for t in run.tracks.values()
                if t.name == L.RAY_STATES_TRACK and t.parent_uuid not in lanes_root]
    for head in heads:
        task = tasks[head.args[L.ARG_TASK_ID]]
        d = by_task[task.id]
        assert run.tracks[head.track_uuid].name == L.RAY_STATES_TRACK
        assert head.name == L.RAY_STATES_PREFIX + task.name
        assert (head.ts, head.end_ts) == (d.ts, d.end_ts)
        states = sorted((s for s in run.slices if s.parent_id == head.id), key=lambda s: s.ts)
        # FINISHED is left out when Ray timed it after the runner saw the task.
        names = [s.name for s in states]
        assert names in (order, order[:-1]), names
        assert all(s.category == L.CAT_RAY and s.depth == 1 for s in states)
        for a, b in itertools.pairwise(states):
            assert a.end_ts == b.ts  # each state lasts until the next
        assert states[-1].end_ts == d.end_ts or names[-1] == L.STATE_RUNNING


def test_late_facts_are_written_as_deltas_on_the_late_chain(
    ray_local: None, tmp_path: Path
) -> None:
    """Executions (drawn when the runner receives their tasks) and Ray's phases and
    states (a second later) are behind the rest of the trace: written in time order
    (RunTimeline.late_batch), they are deltas on the writer's second clock, not
    absolute timestamps (~30% of a level-1 trace of no-op tasks)."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as perfetto_pb2

    from tracer.ray import wait_for_traces

    path = tmp_path / "late.perfetto-trace"
    Pipeline(list(range(NUM_PARTITIONS)), [Stage("inc", _inc), Stage("neg", _neg)]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    wait_for_traces(path)
    packets = perfetto_pb2.Trace.FromString(uncompressed(path.read_bytes())).packet
    clocks = [p.timestamp_clock_id for p in packets if p.HasField("track_event")]
    late = [c for c in clocks if 65 <= c <= 127]
    # Per execution: its slice, Ray's span, phases and states, its task's ends.
    assert len(late) >= 2 * NUM_PARTITIONS * 10, clocks
    assert clocks.count(6) <= len(late) // 10
    model = load(path)
    names = (L.PHASE_DESERIALIZE, L.PHASE_EXECUTE, L.PHASE_STORE_OUTPUTS)
    phases = [s for s in model.slices if s.category == L.CAT_RAY and s.name in names]
    assert len(phases) >= 2 * NUM_PARTITIONS * 2


def _read_until_complete(source: RayEventSource, ids: list[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        facts = {f.ray_task_id: f for f in source.read(ids) if f.span is not None and f.ended}
        if len(facts) == len(ids) or time.monotonic() > deadline:
            return facts
        time.sleep(0.1)


def test_sources_agree_and_a_failing_one_is_replaced(
    ray_local: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The GCS's job query, its per-task query and the read of everything give the same
    facts; a source that raises is dropped for the next."""
    import ray

    ids = task_ids(5)
    gcs = GcsQuery(ray.get_runtime_context().gcs_address)
    by_job = _read_until_complete(RayEventSource(job_id(), [gcs]), ids)
    assert set(by_job) == set(ids)
    # The GCS's reply is kept as bytes: an entry is parsed only when its task is wanted.
    reply = gcs.job(bytes.fromhex(job_id()), 5.0)
    assert reply.events and all(is_raw(e) for e in reply.events)
    per_task = RayEventSource(job_id(), [gcs])
    per_task._job_s = 1e9  # the job is "expensive": one query per task
    assert _read_until_complete(per_task, ids) == by_job
    everything = _read_until_complete(RayEventSource(job_id(), [AllEventsQuery()]), ids)
    assert everything == by_job
    # A Ray whose GlobalState has no _get_all_task_events (2.55): the GCS accessor's read.
    import ray._private.state as state

    with pytest.MonkeyPatch.context() as patch:
        patch.delattr(type(state.state), "_get_all_task_events", raising=False)
        assert not hasattr(state.state, "_get_all_task_events")
        older = _read_until_complete(RayEventSource(job_id(), [AllEventsQuery()]), ids)
    assert older == by_job

    class Broken:
        name = "broken"
        closed = False

        def job(self, job_id: bytes, timeout: float) -> Reply:
            raise ConnectionError("GCS gone")

        task = job

        def close(self) -> None:
            self.closed = True

    broken = Broken()
    source = RayEventSource(job_id(), [broken, AllEventsQuery()])
    with caplog.at_level("WARNING", logger="tracer"):
        assert _read_until_complete(source, ids) == by_job
    assert broken.closed and source.name == "all"
    # Said once, where it was said only at DEBUG (the traces went on lacking events).
    said = [r.getMessage() for r in caplog.records if "failed (ConnectionError" in r.getMessage()]
    assert len(said) == 1 and "reading them from all" in said[0], said

    class Busy(Broken):
        """A GCS too busy to answer in time: the read brings nothing, the source stays
        (it sent every later read to the last resort, which no timeout bounds)."""

        calls = 0

        def job(self, job_id: bytes, timeout: float) -> Reply:
            self.calls += 1
            raise TimeoutError("deadline exceeded")

        task = job

    busy = Busy()
    source = RayEventSource(job_id(), [busy, AllEventsQuery()])
    assert source.read(ids) == [] and source.read(ids) == []
    assert busy.calls == 2 and not busy.closed and source.name == "broken"
    fact = by_job[ids[0]]
    assert fact.worker_pid > 0 and len(fact.node_id) == 56 and fact.name == "noop"


_BIG_JOB_SCRIPT = textwrap.dedent(
    """
    import time
    import ray
    from tracer.ray.ray_events import GcsQuery, RayEventSource

    ray.init(num_cpus=2, object_store_memory=78643200, include_dashboard=False,
             log_to_driver=False)  # (stdout is the answer: no worker's lines in it)

    @ray.remote
    def noop():
        return 1

    # 30 tasks with 200 KB names: Ray's events of the job weigh ~12 MB, as ~14,000 no-op
    # tasks' would, past gRPC's default 4 MiB cap on a reply.
    refs = [noop.options(name="t" + "x" * 200_000).remote() for _ in range(30)]
    ray.get(refs)
    ids = [ref.task_id().hex() for ref in refs]
    source = RayEventSource(ray.get_runtime_context().get_job_id(),
                            [GcsQuery(ray.get_runtime_context().gcs_address)])
    deadline = time.monotonic() + 20
    found = 0
    while found < len(ids) and time.monotonic() < deadline:
        found = len({f.ray_task_id for f in source.read(ids, timeout=30) if f.ended})
        time.sleep(0.2)
    print(found, source.name)
    """
)


def test_a_job_bigger_than_grpcs_default_reply_is_read_from_the_gcs(tmp_path: Path) -> None:
    """A job whose events pass gRPC's default 4 MiB reply cap is still one GCS query: that
    read used to fail, and every later one went to the read of every job's events."""
    script = tmp_path / "big_job.py"
    script.write_text(_BIG_JOB_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script)], env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        capture_output=True, text=True, timeout=120, check=True,
    )
    assert out.stdout.split() == ["30", "gcs"], out.stderr[-2000:]


_NO_GRPC_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["grpc"] = None  # as in an environment where grpcio is not installed
    import ray
    from tracer.ray import wait_for_traces
    from tracer.runner import Pipeline, Stage

    def neg(x):
        return -x

    ray.init(num_cpus=2, object_store_memory=78643200, include_dashboard=False,
             log_to_driver=False)
    for _ in range(2):
        Pipeline(list(range(4)), [Stage("neg", neg)]).run(
            tracing_level=1, trace_path=sys.argv[1], progress=False)
    assert wait_for_traces(timeout=60)
    """
)


def test_without_grpc_rays_events_are_read_the_slow_way_and_the_run_says_why(
    tmp_path: Path,
) -> None:
    """Ray installs grpcio only with its extras. Without it the GCS cannot be queried:
    the run still gets Ray's phases (read from every event Ray holds), and says once why,
    so that a long-lived driver's user can see what its reads cost and what to install."""
    path = tmp_path / "nogrpc.perfetto-trace"
    script = tmp_path / "nogrpc.py"
    script.write_text(_NO_GRPC_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(path)], env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        capture_output=True, text=True, timeout=180, check=True,
    )
    said = [line for line in out.stderr.splitlines() if "cannot be read from the GCS" in line]
    assert len(said) == 1 and "pip install grpcio" in said[0], out.stderr[-2000:]
    model = load(path)  # the second run's trace
    assert _counts(model)[L.ARG_RAY_EVENTS_SOURCE] == "all"
    assert _counts(model)[L.ARG_RAY_EVENTS_MISSING] == 0
    executions = [s for s in model.slices if s.category == L.CAT_EXECUTION]
    phases = [s for s in model.slices if (s.name or "").startswith(L.RAY_TASK_PREFIX)]
    assert len(executions) == 4 and len(phases) >= 4


def test_the_package_installs_what_the_gcs_query_needs() -> None:
    """The GCS query's one import beyond Ray's own install: a declared dependency."""
    from importlib.metadata import requires

    assert any(r.replace(" ", "").startswith("grpcio>=") for r in requires("tracer") or [])


class _Counting:
    """The real GCS query, counting the job and one-task queries asked of it."""

    name = "gcs"

    def __init__(self, gcs: GcsQuery, calls: list[str]) -> None:
        self._gcs = gcs
        self.calls = calls

    def job(self, job_id: bytes, timeout: float) -> Reply:
        self.calls.append("job")
        return self._gcs.job(job_id, timeout)

    def task(self, task_id: bytes, timeout: float) -> Reply:
        self.calls.append("task")
        return self._gcs.task(task_id, timeout)

    def close(self) -> None:
        pass  # the test closes its GcsQuery


def test_the_cheaper_query_is_chosen_by_measured_cost(
    ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    from tracer.ray import ray_events

    monkeypatch.setattr(ray_events, "_MEASURED", {})  # no earlier run measured this job
    ids = task_ids(3)
    calls: list[str] = []
    gcs = GcsQuery(ray.get_runtime_context().gcs_address)

    source = RayEventSource(job_id(), [_Counting(gcs, calls)])
    source.read(ids)
    assert calls == ["job"]  # its cost is unknown until measured
    source._job_s = 1.0  # a job whose events take a second to read: per task is cheaper
    calls.clear()
    source.read(ids)
    assert calls == ["task"] * 3
    source._one_task_s = 2.0  # and the other way round
    calls.clear()
    source.read(ids)
    assert calls == ["job"]
    assert source.stored >= 3  # the job's tasks Ray holds, as its reply said

    # The next run's source of the same job starts from what this one measured: a
    # long-lived driver's job holds every earlier run's tasks, and its first read of
    # the whole job could take seconds.
    source._job_s = 1.0
    source.read_each(ids[:1])  # any read records what was measured
    calls.clear()
    RayEventSource(job_id(), [_Counting(gcs, calls)]).read(ids)
    assert calls == ["task"] * 3
    gcs.close()


def test_switched_off_nothing_is_read(
    ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACER_RAY_EVENTS", "0")
    path = tmp_path / "off.perfetto-trace"
    Pipeline([1, 2], [Stage("neg", _neg)]).run(tracing_level=1, trace_path=path, progress=False)
    model = load(path)
    assert not [t for t in model.tracks.values()
                if t.name in (L.RAY_PHASES_TRACK, L.RAY_STATES_TRACK)]
    assert not [i for i in model.instants if i.name == L.INSTANT_RAY_EVENTS]


_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import ray
    from tracer.runner import Pipeline, Stage

    def neg(x):
        return -x

    ray.init(num_cpus=2, object_store_memory=78643200, include_dashboard=False)
    t0 = time.monotonic()
    Pipeline(list(range(int(sys.argv[2]))), [Stage("neg", neg)]).run(
        tracing_level=1, trace_path=sys.argv[1], progress=False)
    print(time.monotonic() - t0)
    """
)


def _run_with_ray_env(tmp_path: Path, env: dict[str, str], n: int) -> tuple[TraceModel, float]:
    path = tmp_path / "run.perfetto-trace"
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(path), str(n)], env={**os.environ, **env},
        capture_output=True, text=True, timeout=120, check=True,
    )
    return load(path), float(out.stdout.strip().splitlines()[-1])


def test_events_that_never_come_are_counted_and_the_close_waits_its_budget(
    tmp_path: Path,
) -> None:
    """Ray not reporting task events (interval 0): the close waits its budget, no longer,
    and the trace says every execution lacks Ray's events."""
    model, seconds = _run_with_ray_env(
        tmp_path,
        {"RAY_task_events_report_interval_ms": "0", "TRACER_RAY_EVENTS_BUDGET_S": "0.5"}, 4)
    assert not [s for s in model.slices if (s.name or "").startswith(L.RAY_TASK_PREFIX)]
    assert _counts(model)[L.ARG_RAY_EVENTS_MISSING] == 4
    assert len([s for s in model.slices if s.category == L.CAT_EXECUTION]) == 4
    assert seconds < 30  # generous: the point is that it ends, not how fast
    # ... and `tracer summary` says so under its header.
    out = subprocess.run(
        [sys.executable, "-m", "tracer", "summary", str(tmp_path / "run.perfetto-trace"),
         "--engine", "reader"], capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert out.splitlines()[1] == "Ray's events read from gcs: 4 executions without them"


def test_events_ray_dropped_are_counted(tmp_path: Path) -> None:
    """Ray keeping only 5 task attempts: the trace says Ray dropped some and how many
    executions lack their events; those it kept are drawn."""
    model, _ = _run_with_ray_env(
        tmp_path, {"RAY_task_events_max_num_task_in_gcs": "5",
                   "TRACER_RAY_EVENTS_BUDGET_S": "1"}, 20)
    counts = _counts(model)  # the process waited at its exit for its trace to be finished
    spans = [s for s in model.slices if (s.name or "").startswith(L.RAY_TASK_PREFIX)]
    assert counts[L.ARG_RAY_EVENTS_DROPPED] > 0
    assert counts[L.ARG_RAY_EVENTS_MISSING] == 20 - len(spans)
    assert 0 < len(spans) < 20  # some read before Ray evicted them, not all


def _nap(x: int) -> int:
    time.sleep(0.3)
    return x


def test_a_read_outlasting_the_flushers_join_does_not_deadlock_the_close(
    ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flusher's read of Ray's events still under way when the close begins (longer
    than the close waits for the flusher): it holds the channel's read lock and then
    wants the tracer's lock, which the close holds. The run ends within its budgets, the
    trace is complete, and the late read draws nothing into the closed trace."""
    import threading

    import ray

    from tracer.ray import flusher, ray_events

    gcs = GcsQuery(ray.get_runtime_context().gcs_address)
    started = threading.Event()
    JOIN_S = 1.0  # the flusher's join, shortened from its 5 s for the test's sake

    class Slow:
        name = "gcs"

        def job(self, job_id: bytes, timeout: float) -> Reply:
            started.set()
            time.sleep(3 * JOIN_S)  # past the flusher's join
            return gcs.job(job_id, timeout)

        def task(self, task_id: bytes, timeout: float) -> Reply:
            return self.job(b"", timeout)

        def close(self) -> None:
            pass

    monkeypatch.setattr(ray_events, "_sources", lambda: [Slow()])
    monkeypatch.setattr(flusher, "JOIN_TIMEOUT_S", JOIN_S)
    monkeypatch.setenv("TRACER_RAY_EVENTS_BUDGET_S", "0.5")
    path = tmp_path / "slow.perfetto-trace"
    done: list[Any] = []

    def run_it() -> None:
        done.append(Pipeline(list(range(8)), [Stage("nap", _nap)]).run(
            tracing_level=1, trace_path=path, progress=False))

    thread = threading.Thread(target=run_it, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the run deadlocked in the close"
    assert started.is_set()  # the flusher was reading when the run closed
    assert done == [list(range(8))]
    model = load(path)
    assert len([s for s in model.slices if s.category == L.CAT_EXECUTION]) == 8
    assert _counts(model)[L.ARG_RAY_EVENTS_MISSING] == 8
    time.sleep(4 * JOIN_S)  # the late read ends: nothing breaks, nothing is written after the close
    assert load(path).slices == model.slices
    gcs.close()


class _Fake:
    """A query answering nothing, counting what it was asked."""

    name = "fake"

    def __init__(self, stored: int) -> None:
        self.stored = stored
        self.calls: list[str] = []

    def job(self, job_id: bytes, timeout: float) -> Reply:
        self.calls.append("job")
        return Reply([], 0, self.stored)

    def task(self, task_id: bytes, timeout: float) -> Reply:
        self.calls.append("task")
        return Reply([], 0)

    def close(self) -> None:
        pass


def test_the_query_read_last_is_named_on_the_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ray_events_source`` says which query served (one that raised was replaced), or
    ``none`` when no read succeeded."""
    from tracer.format import TraceWriter, read_trace
    from tracer.ray import ray_events
    from tracer.ray.events_channel import RayEventsChannel
    from tracer.ray.timeline import RunTimeline

    monkeypatch.setattr(ray_events, "_MEASURED", {})  # (costs other tests measured)

    class Broken(_Fake):
        name = "broken"

        def job(self, job_id: bytes, timeout: float) -> Reply:
            raise ConnectionError("GCS gone")

        task = job

    for queries, expected in (([], "none"), ([Broken(0), _Fake(0)], "fake")):
        path = tmp_path / f"{expected}.perfetto-trace"
        with TraceWriter(path) as w:
            timeline = RunTimeline(w, execution_id="src", loop_pid=7, loop_tid=7)
            source = RayEventSource("01000000", queries)
            channel = RayEventsChannel(timeline, threading.RLock(), source)
            source.read(["aa" * 24])
            ts = w.now()
            timeline.end_run(ts)
            timeline.ray_events_read(ts, channel.source_name)  # as the runner's close does
        (read,) = [i for i in read_trace(path).instants if i.name == L.INSTANT_RAY_EVENTS]
        assert read.args[L.ARG_RAY_EVENTS_SOURCE] == expected


def test_a_read_of_the_job_waits_until_it_is_mostly_of_tasks_wanted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At flushes: a job holding 1000 tasks is read for 1000 wanted, not for 10 (each
    read would send the whole job again); nor are 10 read one query each (a round trip
    per task): they wait for the close."""
    from tracer.ray import ray_events

    monkeypatch.setattr(ray_events, "_MEASURED", {})
    fake = _Fake(stored=1000)
    source = RayEventSource("01000000", [fake])
    assert source.worth_reading(10, 0.5)  # nothing stored yet: read
    source.read(["aa" * 24])
    assert fake.calls == ["job"] and source.stored == 1000
    assert not source.worth_reading(10, 0.5)
    assert not source.worth_reading(999, 0.5)
    assert source.worth_reading(1000, 0.5)
    assert not source.worth_reading(0, 0.5)


def test_a_run_is_sent_about_a_third_more_than_once_by_the_reads_at_flushes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The channel's share (0.75): a run that grows its job by 100 tasks between flushes
    reads it only when the job has grown fourfold since the last read, so the job is
    sent ~1.33 times over by the end (the close's read of everything included), not
    twice (share 0.5, which sent a 2000-task run 2.2 times: ~20 µs of CPU per task
    in the driver and the GCS, each time)."""
    from tracer.ray import ray_events
    from tracer.ray.events_channel import _READ_SHARE

    monkeypatch.setattr(ray_events, "_MEASURED", {})
    monkeypatch.delenv("RAY_task_events_max_num_task_in_gcs", raising=False)
    fake = _Fake(stored=0)
    source = RayEventSource("01000000", [fake])
    job = sent = wanted = 0
    for _ in range(200):  # flushes, 100 new tasks each: 20,000 in all
        job += 100
        wanted += 100
        if source.worth_reading(wanted, _READ_SHARE):
            fake.stored = job
            source.read(["aa" * 24])
            sent += job
            wanted = 0
    sent += job  # the close's read of the job
    assert 1.2 * job <= sent <= 1.45 * job, sent / job


def test_reads_keep_up_with_what_ray_drops_at_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's GCS keeps a capped number of task attempts (all jobs), dropping the oldest
    finished: once the job is at the cap it no longer grows fourfold, and a read is due
    when half of what Ray keeps is wanted, before any of it is dropped."""
    from tracer.ray import ray_events

    monkeypatch.setattr(ray_events, "_MEASURED", {})
    monkeypatch.setenv("RAY_task_events_max_num_task_in_gcs", "1000")
    assert ray_events.ray_cap() == 1000
    fake = _Fake(stored=1000)
    source = RayEventSource("01000000", [fake])
    source.read(["aa" * 24])
    assert not source.worth_reading(499, 0.75)
    assert source.worth_reading(500, 0.75)
    monkeypatch.setenv("RAY_task_events_max_num_task_in_gcs", "many")
    assert ray_events.ray_cap() == 100_000  # Ray's default, for a value that is not one


def test_the_close_reads_the_job_once_the_probes_say_ray_has_it_all(
    ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the close, Ray's last events come within its report interval (1 s). Instead of
    reading the whole job every 0.2 s until then, one-task queries of each worker's last
    execution tell when they came; then one read of the job draws them all."""
    import ray

    from tracer.ray import ray_events

    gcs = GcsQuery(ray.get_runtime_context().gcs_address)
    calls: list[str] = []

    monkeypatch.setattr(ray_events, "_MEASURED", {})
    monkeypatch.setattr(ray_events, "_sources", lambda: [_Counting(gcs, calls)])
    monkeypatch.setenv("TRACER_RAY_EVENTS_BUDGET_S", "5")
    path = tmp_path / "probes.perfetto-trace"
    Pipeline(list(range(30)), [Stage("neg", _neg)]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    model = load(path)
    assert _counts(model)[L.ARG_RAY_EVENTS_MISSING] == 0
    spans = [s for s in model.slices if (s.name or "").startswith(L.RAY_TASK_PREFIX)]
    assert len(spans) == 30
    assert "task" in calls  # the probes
    assert calls.count("job") <= 2, calls
    gcs.close()


def test_the_run_returns_before_rays_last_events_and_the_trace_is_finished_after(
    ray_local: None, tmp_path: Path
) -> None:
    """Ray reports its events a second late: the run does not wait for them. When it
    returns its trace is already complete and valid but for Ray's last events; a thread
    draws them and ends the file, wait_for_traces waits for it, and a run traced to the
    same file again waits for it before writing."""
    from tracer.format import read_trace
    from tracer.ray import wait_for_traces

    path = tmp_path / "late.perfetto-trace"
    Pipeline(list(range(30)), [Stage("neg", _neg)]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    assert not wait_for_traces(path, timeout=0)  # still being finished
    early = read_trace(path)
    assert not early.problems and not early.truncated
    assert _run_slice(early).dur is not None
    assert len([s for s in early.slices if s.category == L.CAT_EXECUTION]) == 30
    assert not [i for i in early.instants if i.name == L.INSTANT_RAY_EVENTS]
    assert wait_for_traces(path, timeout=30)
    model = load(path)
    assert _counts(model)[L.ARG_RAY_EVENTS_MISSING] == 0
    assert len([s for s in model.slices if (s.name or "").startswith(L.RAY_TASK_PREFIX)]) == 30
    assert _run_slice(model).ts == _run_slice(early).ts
    assert _run_slice(model).dur == _run_slice(early).dur  # the run ended when it ended

    Pipeline(list(range(30)), [Stage("neg", _neg)]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    Pipeline(list(range(30)), [Stage("neg", _neg)]).run(
        tracing_level=1, trace_path=path, progress=False
    )  # opened while the last one is being finished: after it
    assert _counts(load(path))[L.ARG_RAY_EVENTS_MISSING] == 0


def test_ray_shutdown_right_after_a_run_waits_for_its_last_events(
    ray_local: None, tmp_path: Path
) -> None:
    """A script that shuts Ray down as soon as its run returned: after the shutdown Ray
    can be asked nothing, so ray.shutdown() first lets the trace being finished read
    Ray's last events (they were all missing: the run is shorter than Ray's report
    interval). A driver of its own, on the tests' Ray: its shutdown only disconnects it."""
    from own_driver import run_driver

    path = tmp_path / "shutdown.perfetto-trace"
    code = textwrap.dedent(f"""
        import ray
        from tracer.format import read_trace
        from tracer.ray import layout as L
        from tracer.runner import Pipeline, Stage

        def neg(x):
            return -x

        ray.init()
        Pipeline(list(range(8)), [Stage("neg", neg)]).run(
            tracing_level=1, trace_path={str(path)!r}, progress=False)
        ray.shutdown()
        (read,) = [i for i in read_trace({str(path)!r}).instants
                   if i.name == L.INSTANT_RAY_EVENTS]
        print(read.args[L.ARG_RAY_EVENTS_MISSING])
    """)
    assert int(run_driver(code)[-1]) == 0  # none missing
    model = load(path)
    assert len([s for s in model.slices if (s.name or "").startswith(L.RAY_TASK_PREFIX)]) == 8


def test_the_close_can_wait_for_rays_last_events_itself(
    ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracer.format import read_trace
    from tracer.ray import wait_for_traces

    monkeypatch.setenv("TRACER_RAY_EVENTS_WAIT", "1")
    path = tmp_path / "waited.perfetto-trace"
    Pipeline(list(range(30)), [Stage("neg", _neg)]).run(
        tracing_level=1, trace_path=path, progress=False
    )
    assert wait_for_traces(path, timeout=0)
    assert _counts(read_trace(path))[L.ARG_RAY_EVENTS_MISSING] == 0


def test_a_malformed_task_id_is_never_sent_to_ray(ray_local: None) -> None:
    """Ray's GCS asserts a task id's size, and the failed assertion stops it (and with it
    the driver): an id that is not one of Ray's (a runner's made-up measurements) is not
    asked for, and Ray keeps working."""

    source = RayEventSource(job_id())
    assert source.read_each(["ab" * 14, "zz"]) == []
    ids = task_ids(2)
    assert set(_read_until_complete(source, ids)) == set(ids)


def test_ray_task_events_become_facts_in_time_order_with_the_task_s_own_error() -> None:
    """One of Ray's TaskEvents protos, as the GCS sends it, read into the facts the
    timeline draws: its states and phases in time order whatever the order Ray keeps
    them in, the span of ``task::<name>``, the node, worker, resources, and the error
    the body raised (from the task's own profile event) over Ray's error type."""
    from ray.core.generated import common_pb2, gcs_pb2

    from tracer.ray.ray_events_facts import to_facts
    from tracer.ray.task_metrics import RAY_EVENT_NAME, pack_failure

    ev = gcs_pb2.TaskEvents(task_id=bytes(range(24)), attempt_number=1)
    ev.task_info.name = "inc"
    ev.task_info.required_resources["GPU"] = 1.0
    ev.task_info.required_resources["CPU"] = 2.0
    updates = ev.state_updates
    updates.node_id = b"\x07" * 28
    updates.worker_pid = 4242
    for status, ts in ((11, 900), (8, 300), (1, 100), (5, 200), (99, 50)):
        updates.state_ts_ns[status] = ts
    updates.error_info.error_type = common_pb2.ErrorType.Value("TASK_EXECUTION_EXCEPTION")
    updates.error_info.error_message = "RayTaskError(ValueError): bad"
    failure = pack_failure({"rss_start": 10, "rss_end": 20, "rss_peak": 30,
                            "error_type": "ValueError", "error": "bad"}).decode()
    for name, start, end, extra in (
        ("task:store_outputs", 700, 800, ""),
        ("task::inc", 300, 850, ""),
        ("task:deserialize_arguments", 310, 320, ""),
        (RAY_EVENT_NAME, 330, 690, failure),
        ("task:execute", 320, 700, ""),
    ):
        ev.profile_events.events.add(event_name=name, start_time=start, end_time=end,
                                     extra_data=extra)
    other = gcs_pb2.TaskEvents(task_id=bytes(24), attempt_number=0)  # not wanted

    (fact,) = to_facts([other, ev], wanted={bytes(range(24)).hex()})
    assert fact.ray_task_id == bytes(range(24)).hex() and fact.attempt == 1
    assert fact.name == "inc" and fact.worker_pid == 4242 and fact.node_id == "07" * 28
    assert fact.states == (
        (L.STATE_PENDING_ARGS, 100), (L.STATE_SUBMITTED, 200), (L.STATE_RUNNING, 300),
        (L.STATE_FINISHED, 900),
    )
    assert [p[0] for p in fact.phases] == [
        L.PHASE_DESERIALIZE, L.PHASE_EXECUTE, L.PHASE_STORE_OUTPUTS,
    ]
    assert fact.span == (300, 850) and fact.measured == (330, 690)
    assert fact.rss == (10, 20, 30)
    assert (fact.error_type, fact.error) == ("ValueError", "bad")
    assert fact.resources == (("CPU", 2.0), ("GPU", 1.0))


def test_a_failure_known_only_from_rays_text_names_what_the_body_raised() -> None:
    """No report of the tracer's own (an all-to-all task's worker): the exception is read
    out of Ray's traceback text, under Ray Data's wrapper; Ray's other errors keep Ray's
    name and text. Whether the worker will still report the attempt is Ray's to say."""
    from ray.core.generated import common_pb2, gcs_pb2

    from tracer.ray.ray_events_facts import to_facts

    def failed(code: str, message: str) -> Any:
        ev = gcs_pb2.TaskEvents(task_id=bytes(range(24)), attempt_number=0)
        ev.state_updates.state_ts_ns[common_pb2.TaskStatus.Value("FAILED")] = 900
        ev.state_updates.error_info.error_type = common_pb2.ErrorType.Value(code)
        ev.state_updates.error_info.error_message = message
        (fact,) = to_facts([ev], wanted={bytes(range(24)).hex()})
        return fact

    header = "\x1b[36mray::map()\x1b[39m (pid=19428, ip=192.0.2.2)\n"
    text = (  # Ray 2.60's, for a UDF fused into a random shuffle
        "User exception:\n" + header + '  File "/job.py", line 9, in fails_on_7\n'
        '    raise ValueError("no 7 here")\nValueError: no 7 here\n\n'
        "The above exception was the direct cause of the following exception:\n\n" + header
        + "ray.exceptions.UserCodeException: UDF failed to process a data block.")
    fact = failed("TASK_EXECUTION_EXCEPTION", text)
    assert (fact.error_type, fact.error, fact.failed_in_worker) == (
        "ValueError", "no 7 here", True)
    # Cut by Ray before the wrapped exception (2.55 keeps the last ~500 characters): the
    # wrapper, if a frame says where its line is; Ray's own name and text if none does.
    wrapper = "ray.exceptions.UserCodeException: UDF failed to process a data block."
    cut = failed("TASK_EXECUTION_EXCEPTION", "User exception:\n_\n    res = f(batch)\n"
                 '  File "/ray/data/x.py", line 481, in wrap\n    raise Wrapped() from e\n'
                 + wrapper)
    assert (cut.error_type, cut.error) == ("UserCodeException",
                                           "UDF failed to process a data block.")
    frameless = "User exception:\n_\n    res = f(batch)\n" + wrapper
    cut = failed("TASK_EXECUTION_EXCEPTION", frameless)
    assert (cut.error_type, cut.error) == ("RayTaskError", frameless)
    # Ray's OOM report: in a line, as the driver's error reads, its first line and the
    # kill's reason; what it says of the kill as figures (Ray 2.60's text, cut).
    oom = (
        "1 worker(s) were killed due to the node running low on memory. Memory on the node "
        "(IP: 192.0.2.2, ID: 7cadfe99) was 7.10GB used / 23.54GB limit (0.301466)\n"
        "OOM kill reason: Memory usage 7611600896B exceeded threshold of 7582855168B\n"
        "Object store memory usage: [- objects spillable: 0\n]\n"
        "Selected to kill: (Task: task name=flaky, required resources={CPU: 1}, "
        "pid=9431, actual memory used=6.10GB)\n"
        "Top 10 memory users: PID\tMEM(GB)\tCOMMAND\n9431\t6.10\tray::flaky\n"
        "9143\t0.10\tpython job.py\n")
    killed = failed("OUT_OF_MEMORY", oom)
    assert (killed.error_type, killed.failed_in_worker) == ("OutOfMemoryError", False)
    assert killed.error == (
        "1 worker(s) were killed due to the node running low on memory. Memory on the node "
        "(IP: 192.0.2.2, ID: 7cadfe99) was 7.10GB used / 23.54GB limit (0.301466) "
        "OOM kill reason: Memory usage 7611600896B exceeded threshold of 7582855168B")
    gb = 1 << 30
    assert killed.oom_killed == ((9431, int(6.10 * gb)),)
    assert killed.oom_used == int(6.10 * gb)  # (the event names no worker: the one killed)
    assert killed.oom_top == ((9431, int(6.10 * gb), "ray::flaky"),
                              (9143, int(0.10 * gb), "python job.py"))
    assert failed("WORKER_DIED", "crashed").oom_used == 0  # (no OOM report)
    assert failed("TASK_CANCELLED", "cancelled").failed_in_worker
    unreadable = failed("TASK_EXECUTION_EXCEPTION", "RayTaskError(ValueError): bad")
    assert (unreadable.error_type, unreadable.error) == (
        "RayTaskError", "RayTaskError(ValueError): bad")

-- tracer_tables.sql: the tables every tracer analysis is built on.
--
-- Load a runner trace in trace_processor, run this file, then run any of the
-- analysis files next to it (stage_summary.sql, task_latency.sql, ...) or your
-- own SQL over these tables. `tracer query` and tracer.query.TraceQuery run it
-- for you. They are plain SQLite tables with indexes, built once per session:
-- views would join on computed task_id columns and on slice.parent_id, which
-- trace_processor's slice table cannot index, in quadratic time on big traces. The names come from tracer/ray/layout.py; debug annotations are the
-- args named 'debug.<name>' (nested: 'debug.resource_request.memory_bytes').
--
-- What the PerfettoSQL standard library gives is used (checked with
-- trace_processor v58.2): intervals.intersect in worker_utilisation.sql.
-- What the analyses still write by hand, and why:
-- * the node and worker of an execution come from the track tree (a worker's
--   track is under its node's, named 'Node ...'): they are plain tracks, not
--   threads and processes, so slices.with_context's thread_slice has none;
-- * tasks are joined to their executions by the task_id annotation, not by
--   the flow arrows between them (the flow operators): an execution whose
--   task's creation was not written (a cut, a retry) has no arrow;
-- * percentiles are nearest-rank (the value at rank ceil(p * n / 100)), which
--   the reader engine can match exactly; PERCENTILE() interpolates;
-- * dispatch_loop.sql's own time of a phase is not slices.self_dur: it
--   excludes only the phases nested in it, and a slice left open by a cut
--   trace runs to the trace's end (self_dur is negative there), and
--   self_dur is computed for every slice of the trace.
--
-- Timestamps (*_ts) and durations (*_ns) are nanoseconds in the trace clock;
-- memory is in bytes. A slice left open by a truncated trace has dur = -1 in
-- trace_processor: such tasks have no received_ts, and open executions are left
-- out.

-- One row per task attempt: the slice on a "Ray tasks" lane from the task's
-- creation to its receipt (category 'task', named after the stage), with its
-- nested 'dispatched' slice. received_ts is NULL for tasks the runner never
-- received: cut off, closed as 'unfinished' at the end, or 'superseded' by a
-- retry (a task killed with other workers, which its slice cannot tell apart,
-- takes in tracer_task_latency the worker Ray's events name and its memory at
-- the kill: tracer_kill_candidate, tracer_ray_state.worker_pid). status is the
-- task slice's: 'ok' where the runner received the
-- task's result (the slice says nothing then), else 'failed', 'failed
-- upstream', 'cancelled', 'superseded' or 'unfinished' (also a task whose
-- slice a cut trace left open); tracer_task_latency's also takes a failed
-- execution's word. memory_at_kill is set on a task Ray's OOM killer killed
-- (the worker's memory use Ray reported; such a task has no execution slice).
DROP TABLE IF EXISTS tracer_task_latency;
DROP TABLE IF EXISTS tracer_execution;
DROP TABLE IF EXISTS tracer_task;
DROP TABLE IF EXISTS tracer_dispatched;
DROP TABLE IF EXISTS tracer_ray_state;
DROP TABLE IF EXISTS tracer_ray_span;

CREATE TABLE tracer_dispatched AS
SELECT parent_id AS task_slice_id, ts
FROM slice
WHERE category = 'task' AND name = 'dispatched' AND parent_id IS NOT NULL;
CREATE INDEX tracer_dispatched_by_task ON tracer_dispatched(task_slice_id);

CREATE TABLE tracer_task AS
SELECT
  t.id AS slice_id,
  EXTRACT_ARG(t.arg_set_id, 'debug.task_id') AS task_id,
  COALESCE(EXTRACT_ARG(t.arg_set_id, 'debug.attempt'), 0) AS attempt,
  EXTRACT_ARG(t.arg_set_id, 'debug.stage_id') AS stage_id,
  COALESCE(EXTRACT_ARG(t.arg_set_id, 'debug.stage'), t.name) AS stage,
  COALESCE(
    EXTRACT_ARG(t.arg_set_id, 'debug.status'),
    CASE WHEN t.dur < 0 THEN 'unfinished' ELSE 'ok' END
  ) AS status,
  EXTRACT_ARG(t.arg_set_id, 'debug.resource_request.memory_bytes') AS memory_requested,
  EXTRACT_ARG(t.arg_set_id, 'debug.memory_used_at_kill') AS memory_at_kill,
  t.ts AS created_ts,
  d.ts AS dispatched_ts,
  CASE
    WHEN t.dur >= 0
      AND COALESCE(EXTRACT_ARG(t.arg_set_id, 'debug.status'), '')
        NOT IN ('unfinished', 'superseded')
    THEN t.ts + t.dur
  END AS received_ts
FROM slice AS t
LEFT JOIN tracer_dispatched AS d ON d.task_slice_id = t.id
WHERE t.category = 'task' AND t.depth = 0;
CREATE INDEX tracer_task_by_task_id ON tracer_task(task_id);
DROP TABLE tracer_dispatched;

-- Ray's own events of a task attempt (README, "Ray's own events"), where the
-- trace has them. Its scheduling states (category 'scheduler') are nested in
-- a 'ray states <stage>' slice that carries its task_id (and attempt), on the
-- 'Ray states' lanes beside the tasks' lanes. (Traces written before
-- 2026-12-07 have them on a 'Ray states' track under the task's lane: the
-- first state drawn for a task carries its task_id and attempt, the states
-- after it on that track are the same task's, by ts, then id; both are read.)
-- trace_processor's track.parent_id cannot tell the lane (it merges lanes of
-- one name), so a task's states go to the task slice of that task_id and
-- attempt created last at or before the first of them. The latency split
-- needs two, on the owner's (driver's) clock: submitted_ts
-- (SUBMITTED_TO_WORKER: Ray has a worker for it and pushes it there) and
-- replied_ts (FINISHED or FAILED: the owner has the worker's reply), each
-- its last: a retried task's states are its attempts' one after another,
-- and the split is its last attempt's (the failed ones are in its queue).
CREATE TABLE tracer_ray_state AS
WITH state AS (
  SELECT
    s.id,
    s.track_id,
    s.ts,
    s.name,
    EXTRACT_ARG(s.arg_set_id, 'debug.task_id') AS task_id,
    COALESCE(EXTRACT_ARG(s.arg_set_id, 'debug.attempt'), 0) AS attempt
  FROM slice AS s
  JOIN track AS tr ON tr.id = s.track_id
  WHERE s.category = 'scheduler' AND tr.name = 'Ray states'
    AND s.name IN ('PENDING_ARGS_AVAIL', 'PENDING_NODE_ASSIGNMENT', 'SUBMITTED_TO_WORKER',
                   'RUNNING', 'FINISHED', 'FAILED')
),
grouped AS (
  SELECT
    *,
    SUM(task_id IS NOT NULL) OVER (
      PARTITION BY track_id ORDER BY ts, id ROWS UNBOUNDED PRECEDING
    ) AS head
  FROM state
),
per_task AS (
  SELECT
    MAX(task_id) AS task_id,
    MAX(CASE WHEN task_id IS NOT NULL THEN attempt END) AS attempt,
    MIN(CASE WHEN task_id IS NOT NULL THEN ts END) AS head_ts,
    MAX(CASE WHEN name = 'SUBMITTED_TO_WORKER' THEN ts END) AS submitted_ts,
    MAX(CASE WHEN name IN ('FINISHED', 'FAILED') THEN ts END) AS replied_ts,
    NULL AS worker_pid
  FROM grouped
  WHERE head > 0
  GROUP BY track_id, head
  UNION ALL
  SELECT
    EXTRACT_ARG(w.arg_set_id, 'debug.task_id') AS task_id,
    COALESCE(EXTRACT_ARG(w.arg_set_id, 'debug.attempt'), 0) AS attempt,
    w.ts AS head_ts,
    MAX(CASE WHEN s.name = 'SUBMITTED_TO_WORKER' THEN s.ts END) AS submitted_ts,
    MAX(CASE WHEN s.name IN ('FINISHED', 'FAILED') THEN s.ts END) AS replied_ts,
    EXTRACT_ARG(w.arg_set_id, 'debug.worker_pid') AS worker_pid
  FROM slice AS s
  JOIN slice AS w ON w.id = s.parent_id  -- by id: slice.parent_id has no index
  WHERE s.category = 'scheduler' AND s.depth = 1
    AND s.name IN ('PENDING_ARGS_AVAIL', 'PENDING_NODE_ASSIGNMENT', 'SUBMITTED_TO_WORKER',
                   'RUNNING', 'FINISHED', 'FAILED')
    AND w.name GLOB 'ray states *'
  GROUP BY w.id
)
SELECT task_slice_id, MAX(submitted_ts) AS submitted_ts, MAX(replied_ts) AS replied_ts,
  MAX(worker_pid) AS worker_pid
FROM (
  SELECT
    (
      SELECT t.slice_id FROM tracer_task AS t
      WHERE t.task_id = p.task_id AND t.attempt = p.attempt AND t.created_ts <= p.head_ts
      ORDER BY t.created_ts DESC, t.slice_id DESC
      LIMIT 1
    ) AS task_slice_id,
    p.submitted_ts,
    p.replied_ts,
    p.worker_pid
  FROM per_task AS p
)
WHERE task_slice_id IS NOT NULL
GROUP BY task_slice_id;
CREATE INDEX tracer_ray_state_by_task ON tracer_ray_state(task_slice_id);

-- Ray's handling of a task attempt in its worker (on the worker's clock, as
-- the execution): the 'ray task <name>' slice on the worker's 'Ray phases'
-- track, annotated with tracer's task_id, and the end of its 'deserialize
-- arguments' phase (fetching and deserializing the arguments).
DROP TABLE IF EXISTS tracer_ray_args;
CREATE TABLE tracer_ray_args AS
SELECT parent_id AS span_slice_id, MAX(ts + dur) AS args_end_ts
FROM slice
WHERE category = 'scheduler' AND name = 'deserialize arguments' AND dur >= 0
  AND parent_id IS NOT NULL
GROUP BY parent_id;
CREATE INDEX tracer_ray_args_by_span ON tracer_ray_args(span_slice_id);

CREATE TABLE tracer_ray_span AS
SELECT
  r.id AS slice_id,
  EXTRACT_ARG(r.arg_set_id, 'debug.task_id') AS task_id,
  r.ts AS start_ts,
  r.ts + r.dur AS end_ts,
  a.args_end_ts
FROM slice AS r
LEFT JOIN tracer_ray_args AS a ON a.span_slice_id = r.id
WHERE r.category = 'scheduler' AND r.depth = 0 AND r.name GLOB 'ray task *' AND r.dur >= 0;
CREATE INDEX tracer_ray_span_by_task_id ON tracer_ray_span(task_id);
DROP TABLE tracer_ray_args;

-- One row per task execution, measured inside the Ray worker (category
-- 'execution', but not the 'task failed' / 'task cancelled' instants marking
-- where a task stopped: trace_processor keeps instants as zero-length slices),
-- on a worker's track under its node's track, or on a lane under the worker's
-- track when executions overlap; node and worker are those tracks' names).
-- memory_peak is the task's peak memory:
-- memray's heap peak at level 2 (peak_source 'heap'), else the engine's own
-- per-task USS peak of the worker where it measures one and it is the larger
-- (peak_source 'uss': Ray Data), else the worker process's private peak RSS
-- while the task ran (peak_source 'rss': level 1, or level 2 when memray was
-- unavailable). USS and RSS include the worker's own baseline.
CREATE TABLE tracer_execution AS
SELECT
  s.id AS slice_id,
  EXTRACT_ARG(s.arg_set_id, 'debug.task_id') AS task_id,
  s.name AS stage,
  s.ts AS start_ts,
  s.ts + s.dur AS end_ts,
  s.dur AS dur,
  EXTRACT_ARG(s.arg_set_id, 'debug.memory_requested') AS memory_requested,
  EXTRACT_ARG(s.arg_set_id, 'debug.memory_peak') AS memory_peak,
  CASE
    WHEN EXTRACT_ARG(s.arg_set_id, 'debug.memory_peak') IS NULL THEN NULL
    WHEN EXTRACT_ARG(s.arg_set_id, 'debug.heap_peak') IS NOT NULL THEN 'heap'
    WHEN EXTRACT_ARG(s.arg_set_id, 'debug.uss_peak')
      = EXTRACT_ARG(s.arg_set_id, 'debug.memory_peak') THEN 'uss'
    ELSE 'rss'
  END AS peak_source,
  EXTRACT_ARG(s.arg_set_id, 'debug.status') AS status,
  CASE WHEN p.name GLOB 'Node *' THEN p.name ELSE g.name END AS node,
  CASE WHEN p.name GLOB 'Node *' THEN t.name ELSE p.name END AS worker
FROM slice AS s
JOIN track AS t ON t.id = s.track_id
LEFT JOIN track AS p ON p.id = t.parent_id
LEFT JOIN track AS g ON g.id = p.parent_id
WHERE s.category = 'execution' AND s.name NOT IN ('task failed', 'task cancelled')
  AND s.dur >= 0 AND (p.name GLOB 'Node *' OR g.name GLOB 'Node *');
CREATE INDEX tracer_execution_by_task_id ON tracer_execution(task_id);

-- Where a task with no execution stopped: the 'task failed' / 'task cancelled'
-- mark made where Ray's error said it ran (a worker's track, or the node's when
-- the worker is unknown) at the moment its task slice ended. A task Ray killed
-- (OOM killer, crashed worker) has no execution: its node and worker come
-- from here.
DROP TABLE IF EXISTS tracer_mark;
CREATE TABLE tracer_mark AS
SELECT
  EXTRACT_ARG(s.arg_set_id, 'debug.task_id') AS task_id,
  s.ts,
  MIN(CASE WHEN t.name GLOB 'Node *' THEN t.name ELSE p.name END) AS node,
  MIN(CASE WHEN t.name GLOB 'Node *' THEN NULL ELSE t.name END) AS worker
FROM slice AS s
JOIN track AS t ON t.id = s.track_id
LEFT JOIN track AS p ON p.id = t.parent_id
WHERE s.category = 'execution' AND s.name IN ('task failed', 'task cancelled')
  AND (t.name GLOB 'Node *' OR p.name GLOB 'Node *')
GROUP BY 1, 2;
CREATE INDEX tracer_mark_by_task ON tracer_mark(task_id, ts);

-- Attempts of a task that Ray's OOM killer killed and that Ray ran again: the
-- 'task failed' marks with retried set, drawn from Ray's events. A task's
-- memory_at_kill (tracer_task_latency) is the largest of its kills.
DROP TABLE IF EXISTS tracer_retried_kill;
CREATE TABLE tracer_retried_kill AS
SELECT
  EXTRACT_ARG(arg_set_id, 'debug.task_id') AS task_id,
  MAX(EXTRACT_ARG(arg_set_id, 'debug.memory_used_at_kill')) AS memory
FROM slice
WHERE category = 'execution' AND name = 'task failed'
  AND EXTRACT_ARG(arg_set_id, 'debug.retried') IS NOT NULL
  AND EXTRACT_ARG(arg_set_id, 'debug.memory_used_at_kill') IS NOT NULL
GROUP BY 1;
CREATE INDEX tracer_retried_kill_by_task ON tracer_retried_kill(task_id);

-- One row per task attempt with its execution joined by the task_id
-- annotation, and the four phases of its latency:
--   waiting_ns    created -> dispatched  (waiting in the runner for a batch)
--   scheduling_ns dispatched -> started  (Ray scheduling, worker start, args)
--   running_ns    started -> finished    (the task's body)
--   pickup_ns     finished -> received   (until the runner saw the result;
--                 NULL where it was received before it finished)
-- An execution goes to the latest attempt of its task_id created before it
-- started; an attempt keeps its latest execution.
--
-- Where the trace has Ray's events, scheduling and pickup are split into
-- Ray's parts (NULL where an event they need is missing), which add up to
-- the phase they split:
--   sched_queue_ns   dispatched -> SUBMITTED_TO_WORKER (the owner resolving
--                    the arguments and waiting for a worker lease)
--   sched_push_ns    -> Ray's handling starts in the worker (the push to it)
--   sched_args_ns    -> 'deserialize arguments' ends (fetch + deserialize)
--   sched_start_ns   -> started (Ray calling the function, the measurement's start)
--   pickup_store_ns  finished -> Ray's handling ends in the worker (the
--                    measurement's end, serializing and storing the outputs)
--   pickup_notify_ns -> FINISHED/FAILED (the reply reaching the owner)
--   pickup_loop_ns   -> received (the dispatch loop reaching the result)
-- Each boundary is clamped between its neighbours (the worker's clock and
-- the driver's may differ on another node), so the parts are never negative
-- unless the phase they split is. An execution's Ray span is the one of its
-- task_id that started last at or before it (else the first after it).
DROP TABLE IF EXISTS tracer_match;
CREATE TABLE tracer_match AS
WITH candidate AS (
  SELECT
    e.*,
    t.slice_id AS task_slice_id,
    ROW_NUMBER() OVER (
      PARTITION BY e.slice_id
      ORDER BY
        (t.created_ts <= e.start_ts) DESC,
        CASE WHEN t.created_ts <= e.start_ts THEN -t.created_ts ELSE t.created_ts END,
        t.slice_id
    ) AS pick
  FROM tracer_execution AS e
  JOIN tracer_task AS t ON t.task_id = e.task_id
),
latest AS (
  SELECT
    *,
    ROW_NUMBER() OVER (
      PARTITION BY task_slice_id ORDER BY start_ts DESC, slice_id DESC
    ) AS latest_pick
  FROM candidate
  WHERE pick = 1
)
SELECT
  task_slice_id,
  slice_id,
  start_ts,
  end_ts,
  memory_requested,
  memory_peak,
  peak_source,
  status,
  node,
  worker
FROM latest
WHERE latest_pick = 1;
CREATE INDEX tracer_match_by_task ON tracer_match(task_slice_id);

-- One row per execution that Ray's events cover: its Ray span (tracer_ray_span's
-- start_ts, end_ts, args_end_ts), the one of its task_id that started last at
-- or before the execution, else the first after it. Kept (it is not dropped
-- below): worker_utilisation.sql counts a worker busy over the span too.
DROP TABLE IF EXISTS tracer_ray_match;
CREATE TABLE tracer_ray_match AS
WITH candidate AS (
  SELECT
    e.slice_id AS execution_slice_id,
    r.start_ts,
    r.end_ts,
    r.args_end_ts,
    ROW_NUMBER() OVER (
      PARTITION BY e.slice_id
      ORDER BY
        (r.start_ts <= e.start_ts) DESC,
        CASE WHEN r.start_ts <= e.start_ts THEN -r.start_ts ELSE r.start_ts END,
        r.slice_id
    ) AS pick
  FROM tracer_execution AS e
  JOIN tracer_ray_span AS r ON r.task_id = e.task_id
)
SELECT execution_slice_id, start_ts, end_ts, args_end_ts
FROM candidate
WHERE pick = 1;
CREATE INDEX tracer_ray_match_by_execution ON tracer_ray_match(execution_slice_id);

-- The workers a task killed with others may have run in, as its OOM report names
-- them (the task slice's oom_killed_workers: pid -> memory used at the kill).
DROP TABLE IF EXISTS tracer_kill_candidate;
CREATE TABLE tracer_kill_candidate AS
SELECT
  t.slice_id AS task_slice_id,
  CAST(SUBSTR(a.key, LENGTH('debug.oom_killed_workers.') + 1) AS INT) AS pid,
  a.int_value AS memory
FROM tracer_task AS t
JOIN slice AS s ON s.id = t.slice_id
JOIN args AS a ON a.arg_set_id = s.arg_set_id
WHERE t.memory_at_kill IS NOT NULL AND a.key GLOB 'debug.oom_killed_workers.*';
CREATE INDEX tracer_kill_candidate_by_task ON tracer_kill_candidate(task_slice_id, pid);

CREATE TABLE tracer_task_latency AS
WITH joined AS (
  SELECT
    t.task_id,
    t.attempt,
    t.stage_id,
    t.stage,
    CASE WHEN t.status = 'ok' THEN COALESCE(m.status, 'ok') ELSE t.status END AS status,
    CASE WHEN m.slice_id IS NOT NULL THEN m.node ELSE f.node END AS node,
    CASE
      WHEN m.slice_id IS NOT NULL THEN m.worker
      WHEN f.worker IS NOT NULL THEN f.worker
      WHEN k.memory IS NOT NULL THEN 'worker ' || st.worker_pid
    END AS worker,
    t.created_ts,
    t.dispatched_ts,
    m.start_ts AS started_ts,
    m.end_ts AS finished_ts,
    t.received_ts,
    COALESCE(m.memory_requested, t.memory_requested) AS memory_requested,
    m.memory_peak,
    m.peak_source,
    CASE
      WHEN rk.memory IS NULL THEN COALESCE(k.memory, t.memory_at_kill)
      WHEN COALESCE(k.memory, t.memory_at_kill) IS NULL THEN rk.memory
      ELSE MAX(rk.memory, COALESCE(k.memory, t.memory_at_kill))
    END AS memory_at_kill,
    t.slice_id AS task_slice_id,
    m.slice_id AS execution_slice_id,
    r.start_ts AS ray_start_ts,
    r.args_end_ts AS ray_args_end_ts,
    r.end_ts AS ray_end_ts,
    st.submitted_ts,
    st.replied_ts
  FROM tracer_task AS t
  LEFT JOIN tracer_match AS m ON m.task_slice_id = t.slice_id
  LEFT JOIN tracer_ray_match AS r ON r.execution_slice_id = m.slice_id
  LEFT JOIN tracer_ray_state AS st ON st.task_slice_id = t.slice_id
  LEFT JOIN tracer_mark AS f ON f.task_id = t.task_id AND f.ts = t.received_ts
  -- A task killed with other workers: the one Ray's events say ran it, of those its
  -- OOM report names (oom_killed_workers), and that worker's memory at the kill.
  LEFT JOIN tracer_kill_candidate AS k
    ON m.slice_id IS NULL AND k.task_slice_id = t.slice_id AND k.pid = st.worker_pid
  LEFT JOIN tracer_retried_kill AS rk ON rk.task_id = t.task_id
),
-- The boundaries, each clamped between its neighbours (multi-argument MIN
-- and MAX are NULL when an argument is).
outer_bound AS (
  SELECT
    *,
    MIN(MAX(ray_start_ts, dispatched_ts), started_ts) AS worker_ts,
    MIN(MAX(ray_end_ts, finished_ts), received_ts) AS stored_ts
  FROM joined
),
bound AS (
  SELECT
    *,
    MIN(MAX(submitted_ts, dispatched_ts), worker_ts) AS queued_ts,
    MIN(MAX(ray_args_end_ts, worker_ts), started_ts) AS args_ts,
    MIN(MAX(replied_ts, stored_ts), received_ts) AS owner_ts
  FROM outer_bound
)
SELECT
  task_id,
  attempt,
  stage_id,
  stage,
  status,
  node,
  worker,
  created_ts,
  dispatched_ts,
  started_ts,
  finished_ts,
  received_ts,
  dispatched_ts - created_ts AS waiting_ns,
  started_ts - dispatched_ts AS scheduling_ns,
  finished_ts - started_ts AS running_ns,
  CASE WHEN received_ts >= finished_ts THEN received_ts - finished_ts END AS pickup_ns,
  received_ts - created_ts AS total_ns,
  memory_requested,
  memory_peak,
  peak_source,
  memory_at_kill,
  task_slice_id,
  execution_slice_id,
  queued_ts - dispatched_ts AS sched_queue_ns,
  worker_ts - queued_ts AS sched_push_ns,
  args_ts - worker_ts AS sched_args_ns,
  started_ts - args_ts AS sched_start_ns,
  stored_ts - finished_ts AS pickup_store_ns,
  owner_ts - stored_ts AS pickup_notify_ns,
  received_ts - owner_ts AS pickup_loop_ns
FROM bound;
DROP TABLE tracer_match;
DROP TABLE tracer_mark;
DROP TABLE tracer_kill_candidate;
DROP TABLE tracer_retried_kill;

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
-- retry. memory_at_kill is set on a task Ray's OOM killer killed (the worker's
-- memory use Ray reported; such a task has no execution slice).
DROP TABLE IF EXISTS tracer_task_latency;
DROP TABLE IF EXISTS tracer_execution;
DROP TABLE IF EXISTS tracer_task;
DROP TABLE IF EXISTS tracer_dispatched;

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
  EXTRACT_ARG(t.arg_set_id, 'debug.status') AS status,
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

-- One row per task execution, measured inside the Ray worker (category
-- 'execution', but not the 'task failed' / 'task cancelled' instants marking
-- where a task stopped: trace_processor keeps instants as zero-length slices),
-- on a worker's track under its node's track, or on a lane under the worker's
-- track when executions overlap; node and worker are those tracks' names).
-- memory_peak is the task's peak memory:
-- memray's heap peak at level 2 (peak_source 'heap'), else the engine's own
-- per-task USS peak of the worker where it measures one (peak_source 'uss':
-- Ray Data), else the worker process's peak RSS while the task ran
-- (peak_source 'rss': level 1, or level 2 when memray was unavailable). USS and
-- RSS include the worker's own baseline.
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
    WHEN EXTRACT_ARG(s.arg_set_id, 'debug.uss_peak') IS NOT NULL THEN 'uss'
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

-- One row per task attempt with its execution joined by the task_id
-- annotation, and the four phases of its latency:
--   waiting_ns    created -> dispatched  (waiting in the runner for a batch)
--   scheduling_ns dispatched -> started  (Ray scheduling, worker start, args)
--   running_ns    started -> finished    (the task's body)
--   pickup_ns     finished -> received   (until the runner saw the result)
-- An execution goes to the latest attempt of its task_id created before it
-- started; an attempt keeps its latest execution.
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

CREATE TABLE tracer_task_latency AS
SELECT
  t.task_id,
  t.attempt,
  t.stage_id,
  t.stage,
  COALESCE(t.status, m.status, 'ok') AS status,
  m.node,
  m.worker,
  t.created_ts,
  t.dispatched_ts,
  m.start_ts AS started_ts,
  m.end_ts AS finished_ts,
  t.received_ts,
  t.dispatched_ts - t.created_ts AS waiting_ns,
  m.start_ts - t.dispatched_ts AS scheduling_ns,
  m.end_ts - m.start_ts AS running_ns,
  t.received_ts - m.end_ts AS pickup_ns,
  t.received_ts - t.created_ts AS total_ns,
  COALESCE(m.memory_requested, t.memory_requested) AS memory_requested,
  m.memory_peak,
  m.peak_source,
  t.memory_at_kill,
  t.slice_id AS task_slice_id,
  m.slice_id AS execution_slice_id
FROM tracer_task AS t
LEFT JOIN tracer_match AS m ON m.task_slice_id = t.slice_id;
DROP TABLE tracer_match;

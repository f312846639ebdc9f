-- task_retries.sql: the tasks Ray ran more than once (a crashed or OOM-killed
-- worker, a lost node, retry_exceptions), in the order they were created,
-- whatever became of them. Needs tracer_tables.sql.
--   ray_attempts          how many times Ray ran it, as far as the trace knows: the
--                         most of the task slice's ray_attempts, its executions'
--                         highest ray_attempt + 1, and its failed attempts seen + 1
--   unmeasured_attempts   of those, the attempts nothing was measured of (their
--                         worker died with them); NULL where the trace does not say
--   failed_attempts_seen  failed attempts Ray's events showed (their 'task failed'
--                         marks with retried; 0 without Ray's events)
--   error_type            the first of those's error (OutOfMemoryError, ...)
--   memory_at_kill        the largest memory Ray's OOM killer reported at their kills
--   node                  the node its last execution ran on (where it ran in the end)
WITH ran AS (
  SELECT
    e.task_id,
    MAX(COALESCE(EXTRACT_ARG(s.arg_set_id, 'debug.ray_attempt'), 0)) AS highest
  FROM tracer_execution AS e
  JOIN slice AS s ON s.id = e.slice_id
  GROUP BY e.task_id
),
last_run AS (
  SELECT task_id, node
  FROM (
    SELECT
      task_id,
      node,
      ROW_NUMBER() OVER (PARTITION BY task_id ORDER BY start_ts DESC, slice_id DESC) AS n
    FROM tracer_execution
  )
  WHERE n = 1
),
failed_mark AS (
  SELECT
    EXTRACT_ARG(arg_set_id, 'debug.task_id') AS task_id,
    EXTRACT_ARG(arg_set_id, 'debug.error_type') AS error_type,
    EXTRACT_ARG(arg_set_id, 'debug.memory_used_at_kill') AS memory,
    ROW_NUMBER() OVER (
      PARTITION BY EXTRACT_ARG(arg_set_id, 'debug.task_id') ORDER BY ts, id
    ) AS n
  FROM slice
  WHERE category = 'execution' AND name = 'task failed'
    AND EXTRACT_ARG(arg_set_id, 'debug.retried') IS NOT NULL
),
failed AS (
  SELECT
    task_id,
    COUNT(*) AS seen,
    MAX(CASE WHEN n = 1 THEN error_type END) AS error_type,
    MAX(memory) AS memory
  FROM failed_mark
  GROUP BY task_id
),
counted AS (
  SELECT
    t.task_id,
    t.attempt,
    t.stage_id,
    t.stage,
    t.status,
    t.created_ts,
    t.slice_id,
    MAX(
      COALESCE(EXTRACT_ARG(s.arg_set_id, 'debug.ray_attempts'), 1),
      COALESCE(r.highest + 1, 1),
      COALESCE(f.seen + 1, 1)
    ) AS ray_attempts,
    EXTRACT_ARG(s.arg_set_id, 'debug.unmeasured_attempts') AS unmeasured_attempts,
    COALESCE(f.seen, 0) AS failed_attempts_seen,
    f.error_type,
    f.memory AS memory_at_kill,
    l.node
  FROM tracer_task AS t
  JOIN slice AS s ON s.id = t.slice_id
  LEFT JOIN ran AS r ON r.task_id = t.task_id
  LEFT JOIN last_run AS l ON l.task_id = t.task_id
  LEFT JOIN failed AS f ON f.task_id = t.task_id
)
SELECT
  task_id, attempt, stage_id, stage, status, ray_attempts, unmeasured_attempts,
  failed_attempts_seen, error_type, memory_at_kill, node
FROM counted
WHERE ray_attempts >= 2
ORDER BY created_ts, slice_id;

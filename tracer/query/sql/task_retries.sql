-- task_retries.sql: the tasks Ray ran more than once (a crashed or OOM-killed
-- worker, a lost node, retry_exceptions), in the order they were created,
-- whatever became of them. Needs tracer_tables.sql.
--   ray_attempts          how many times Ray ran it, as far as the trace knows: the
--                         most of the task slice's ray_attempts, its executions'
--                         highest ray_attempt + 1, and its failed attempts seen + 1
--   unmeasured_attempts   of those, the attempts nothing was measured of (their
--                         worker died with them); NULL where the trace does not say
--   failed_attempts_seen  failed attempts the trace shows: from Ray's events (the
--                         'task failed' marks with retried), and executions that
--                         failed before the task's last one (measured through the
--                         metrics actor)
--   error_type            the first of those's error (OutOfMemoryError, ...)
--   memory_at_kill        the largest memory Ray's OOM killer reported at their kills
--   failed_node           where the first of those failed: its node, and its worker
--   failed_worker         (NULL where Ray's events do not say)
--   lost_ns               how long those attempts ran before they failed, in all
--                         (their 'failed attempt' slices and failed executions)
--   node                  the node its last execution ran on (where it ran in the end)
WITH ran AS (
  SELECT
    e.task_id,
    MAX(COALESCE(EXTRACT_ARG(s.arg_set_id, 'debug.ray_attempt'), 0)) AS highest
  FROM tracer_execution AS e
  JOIN slice AS s ON s.id = e.slice_id
  GROUP BY e.task_id
),
ordered_run AS (
  SELECT
    e.*,
    ROW_NUMBER() OVER (
      PARTITION BY e.task_id ORDER BY e.start_ts DESC, e.slice_id DESC
    ) AS from_last
  FROM tracer_execution AS e
),
last_run AS (
  SELECT task_id, node FROM ordered_run WHERE from_last = 1
),
failed_attempt AS (
  -- From Ray's events: where the attempt failed, and its memory at an OOM kill.
  SELECT
    EXTRACT_ARG(s.arg_set_id, 'debug.task_id') AS task_id,
    s.ts,
    s.id,
    EXTRACT_ARG(s.arg_set_id, 'debug.error_type') AS error_type,
    EXTRACT_ARG(s.arg_set_id, 'debug.memory_used_at_kill') AS memory,
    CASE WHEN t.name GLOB 'Node *' THEN t.name WHEN p.name GLOB 'Node *' THEN p.name END
      AS node,
    CASE WHEN p.name GLOB 'Node *' THEN t.name END AS worker,
    NULL AS lost
  FROM slice AS s
  JOIN track AS t ON t.id = s.track_id
  LEFT JOIN track AS p ON p.id = t.parent_id
  WHERE s.category = 'execution' AND s.name = 'task failed'
    AND EXTRACT_ARG(s.arg_set_id, 'debug.retried') IS NOT NULL
  UNION ALL
  -- Measured (the metrics actor): an execution that failed before the task's last one.
  SELECT
    o.task_id,
    o.end_ts AS ts,
    o.slice_id AS id,
    EXTRACT_ARG(s.arg_set_id, 'debug.error_type') AS error_type,
    NULL AS memory,
    o.node,
    o.worker,
    o.dur AS lost
  FROM ordered_run AS o
  JOIN slice AS s ON s.id = o.slice_id
  WHERE o.from_last > 1 AND o.status IN ('failed', 'cancelled')
),
numbered AS (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY task_id ORDER BY ts, id) AS n
  FROM failed_attempt
),
failed AS (
  SELECT
    task_id,
    COUNT(*) AS seen,
    MAX(CASE WHEN n = 1 THEN error_type END) AS error_type,
    MAX(memory) AS memory,
    MAX(CASE WHEN n = 1 THEN node END) AS node,
    MAX(CASE WHEN n = 1 THEN worker END) AS worker,
    SUM(lost) AS lost
  FROM numbered
  GROUP BY task_id
),
attempt_time AS (
  -- The 'failed attempt' slices drawn from Ray's events: how long each ran.
  SELECT EXTRACT_ARG(arg_set_id, 'debug.task_id') AS task_id, SUM(dur) AS lost
  FROM slice
  WHERE category = 'attempt' AND dur >= 0
  GROUP BY 1
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
    f.node AS failed_node,
    f.worker AS failed_worker,
    CASE
      WHEN f.lost IS NULL AND a.lost IS NULL THEN NULL
      ELSE COALESCE(f.lost, 0) + COALESCE(a.lost, 0)
    END AS lost_ns,
    l.node
  FROM tracer_task AS t
  JOIN slice AS s ON s.id = t.slice_id
  LEFT JOIN ran AS r ON r.task_id = t.task_id
  LEFT JOIN last_run AS l ON l.task_id = t.task_id
  LEFT JOIN failed AS f ON f.task_id = t.task_id
  LEFT JOIN attempt_time AS a ON a.task_id = t.task_id
)
SELECT
  task_id, attempt, stage_id, stage, status, ray_attempts, unmeasured_attempts,
  failed_attempts_seen, error_type, memory_at_kill, failed_node, failed_worker, lost_ns, node
FROM counted
WHERE ray_attempts >= 2
ORDER BY created_ts, slice_id;

-- stage_summary.sql: one row per stage. Needs tracer_tables.sql.
--   tasks, failed        task attempts, and those that failed themselves (status
--                        'failed'; tasks that never ran because an upstream task
--                        failed have status 'failed upstream' in task_latency)
--   wall_ns              first task created -> last task received
--   dur_p50/p95/max_ns   task running time (the execution measured in the worker)
--   memory_requested     the largest memory request of the stage's tasks (bytes)
--   peak_p50/max_bytes   the tasks' measured peak memory
--   over_request         tasks with a request whose peak exceeded it
-- Percentiles are nearest-rank: the value at rank ceil(p * n / 100).
WITH metric_value AS (
  SELECT stage_id, 'dur' AS metric, running_ns AS v
  FROM tracer_task_latency WHERE running_ns IS NOT NULL
  UNION ALL
  SELECT stage_id, 'peak' AS metric, memory_peak AS v
  FROM tracer_task_latency WHERE memory_peak IS NOT NULL
),
ranked AS (
  SELECT
    stage_id,
    metric,
    v,
    ROW_NUMBER() OVER (PARTITION BY stage_id, metric ORDER BY v) AS pick,
    COUNT(*) OVER (PARTITION BY stage_id, metric) AS n
  FROM metric_value
),
pct AS (
  SELECT
    stage_id,
    MAX(CASE WHEN metric = 'dur' AND pick = (50 * n + 99) / 100 THEN v END) AS dur_p50_ns,
    MAX(CASE WHEN metric = 'dur' AND pick = (95 * n + 99) / 100 THEN v END) AS dur_p95_ns,
    MAX(CASE WHEN metric = 'dur' THEN v END) AS dur_max_ns,
    MAX(CASE WHEN metric = 'peak' AND pick = (50 * n + 99) / 100 THEN v END) AS peak_p50_bytes,
    MAX(CASE WHEN metric = 'peak' THEN v END) AS peak_max_bytes
  FROM ranked
  GROUP BY stage_id
),
per_stage AS (
  SELECT
    stage_id,
    MIN(stage) AS stage,
    COUNT(*) AS tasks,
    COUNT(CASE WHEN status = 'failed' THEN 1 END) AS failed,
    MAX(received_ts) - MIN(created_ts) AS wall_ns,
    MAX(memory_requested) AS memory_requested,
    COUNT(
      CASE WHEN memory_requested > 0 AND memory_peak > memory_requested THEN 1 END
    ) AS over_request
  FROM tracer_task_latency
  GROUP BY stage_id
)
SELECT
  s.stage_id,
  s.stage,
  s.tasks,
  s.failed,
  s.wall_ns,
  p.dur_p50_ns,
  p.dur_p95_ns,
  p.dur_max_ns,
  s.memory_requested,
  p.peak_p50_bytes,
  p.peak_max_bytes,
  s.over_request
FROM per_stage AS s
LEFT JOIN pct AS p ON p.stage_id IS s.stage_id
ORDER BY s.stage_id;

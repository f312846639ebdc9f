-- memory_by_stage.sql: requested vs actual memory, one row per stage.
-- Needs tracer_tables.sql.
--   tasks / measured     task attempts, and those with a measured peak
--   requested_bytes      the largest memory request of the stage's tasks
--   peak_p50/max_bytes   measured peaks (nearest-rank p50)
--   over_request         tasks with a request (> 0) whose peak exceeded it
--   no_request           measured tasks that requested no memory
--   oom_killed           tasks Ray's OOM killer killed (or killed an attempt of,
--                        which Ray ran again)
--   peak_to_request_max  the largest peak / request of the stage
-- memory_peak is memray's heap peak at level 2, else the worker's RSS (level 1;
-- it includes the worker process itself): see tracer_execution.peak_source.
WITH ranked AS (
  SELECT
    stage_id,
    memory_peak,
    ROW_NUMBER() OVER (PARTITION BY stage_id ORDER BY memory_peak) AS pick,
    COUNT(*) OVER (PARTITION BY stage_id) AS n
  FROM tracer_task_latency
  WHERE memory_peak IS NOT NULL
),
pct AS (
  SELECT stage_id, MAX(CASE WHEN pick = (50 * n + 99) / 100 THEN memory_peak END) AS p50
  FROM ranked
  GROUP BY stage_id
),
per_stage AS (
  SELECT
    stage_id,
    MIN(stage) AS stage,
    COUNT(*) AS tasks,
    COUNT(memory_peak) AS measured,
    MAX(memory_requested) AS requested_bytes,
    MAX(memory_peak) AS peak_max_bytes,
    COUNT(
      CASE WHEN memory_requested > 0 AND memory_peak > memory_requested THEN 1 END
    ) AS over_request,
    COUNT(
      CASE WHEN COALESCE(memory_requested, 0) = 0 AND memory_peak IS NOT NULL THEN 1 END
    ) AS no_request,
    COUNT(memory_at_kill) AS oom_killed,
    MAX(
      CASE WHEN memory_requested > 0 THEN CAST(memory_peak AS REAL) / memory_requested END
    ) AS peak_to_request_max
  FROM tracer_task_latency
  GROUP BY stage_id
)
SELECT
  s.stage_id,
  s.stage,
  s.tasks,
  s.measured,
  s.requested_bytes,
  p.p50 AS peak_p50_bytes,
  s.peak_max_bytes,
  s.over_request,
  s.no_request,
  s.oom_killed,
  s.peak_to_request_max
FROM per_stage AS s
LEFT JOIN pct AS p ON p.stage_id IS s.stage_id
ORDER BY s.stage_id;

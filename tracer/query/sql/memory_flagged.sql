-- memory_flagged.sql: the tasks that used more memory than they asked for.
-- Needs tracer_tables.sql. A task is flagged when
--   reason 'oom killed'    Ray's OOM killer killed it (peak_bytes: the worker's
--                          memory use Ray reported at the kill), or
--   reason 'over request'  its measured peak exceeded its request (> 0).
-- Tasks that requested no memory are never "over" (see memory_by_stage.sql's
-- no_request). excess_bytes and ratio compare with the request (NULL without
-- one). OOM kills first, then the largest excess.
WITH flagged AS (
  SELECT
    *,
    CASE WHEN memory_at_kill IS NOT NULL THEN 'oom killed' ELSE 'over request' END AS reason,
    COALESCE(memory_peak, memory_at_kill) AS peak_bytes,
    CASE WHEN memory_peak IS NOT NULL THEN peak_source ELSE 'at kill' END AS source
  FROM tracer_task_latency
  WHERE memory_at_kill IS NOT NULL
    OR (memory_requested > 0 AND memory_peak > memory_requested)
)
SELECT
  task_id,
  attempt,
  stage_id,
  stage,
  node,
  worker,
  reason,
  memory_requested AS requested_bytes,
  peak_bytes,
  source AS peak_source,
  CASE WHEN memory_requested > 0 THEN peak_bytes - memory_requested END AS excess_bytes,
  CASE WHEN memory_requested > 0 THEN CAST(peak_bytes AS REAL) / memory_requested END AS ratio
FROM flagged
ORDER BY
  reason = 'oom killed' DESC,
  excess_bytes IS NULL,
  excess_bytes DESC,
  task_id,
  attempt;

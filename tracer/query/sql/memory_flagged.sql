-- memory_flagged.sql: the tasks that used more memory than they asked for.
-- Needs tracer_tables.sql. A task is flagged when
--   reason 'oom killed'    Ray's OOM killer killed it, or an attempt of it that
--                          Ray ran again (peak_bytes: the worker's memory use Ray
--                          reported at its largest kill, or its measured peak where
--                          that is larger), or
--   reason 'over request'  its measured peak exceeded its request (> 0).
-- Tasks that requested no memory are never "over" (see memory_by_stage.sql's
-- no_request). excess_bytes and ratio compare with the request (NULL without
-- one). OOM kills first, then the largest excess.
WITH flagged AS (
  SELECT
    *,
    CASE WHEN memory_at_kill IS NOT NULL THEN 'oom killed' ELSE 'over request' END AS reason,
    CASE
      WHEN memory_at_kill IS NOT NULL AND (memory_peak IS NULL OR memory_at_kill > memory_peak)
      THEN memory_at_kill ELSE memory_peak
    END AS peak_bytes,
    CASE
      WHEN memory_at_kill IS NOT NULL AND (memory_peak IS NULL OR memory_at_kill > memory_peak)
      THEN 'at kill' ELSE peak_source
    END AS source
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

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
WITH retried_kill AS (
  -- Per task, its largest kill in an attempt Ray ran again, and where it was: a task
  -- flagged for that kill is placed there, not on the worker its retry ran on.
  SELECT task_id, memory, node, worker
  FROM (
    SELECT
      EXTRACT_ARG(s.arg_set_id, 'debug.task_id') AS task_id,
      EXTRACT_ARG(s.arg_set_id, 'debug.memory_used_at_kill') AS memory,
      CASE WHEN t.name GLOB 'Node *' THEN t.name WHEN p.name GLOB 'Node *' THEN p.name END
        AS node,
      CASE WHEN p.name GLOB 'Node *' THEN t.name END AS worker,
      ROW_NUMBER() OVER (
        PARTITION BY EXTRACT_ARG(s.arg_set_id, 'debug.task_id')
        ORDER BY EXTRACT_ARG(s.arg_set_id, 'debug.memory_used_at_kill') DESC, s.ts, s.id
      ) AS n
    FROM slice AS s
    JOIN track AS t ON t.id = s.track_id
    LEFT JOIN track AS p ON p.id = t.parent_id
    WHERE s.category = 'execution' AND s.name = 'task failed'
      AND EXTRACT_ARG(s.arg_set_id, 'debug.retried') IS NOT NULL
      AND EXTRACT_ARG(s.arg_set_id, 'debug.memory_used_at_kill') IS NOT NULL
  )
  WHERE n = 1
),
judged AS (
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
),
flagged AS (
  SELECT
    j.*,
    CASE WHEN j.source = 'at kill' AND k.memory = j.peak_bytes THEN k.node ELSE j.node END
      AS kill_node,
    CASE WHEN j.source = 'at kill' AND k.memory = j.peak_bytes THEN k.worker ELSE j.worker END
      AS kill_worker
  FROM judged AS j
  LEFT JOIN retried_kill AS k ON k.task_id = j.task_id
)
SELECT
  task_id,
  attempt,
  stage_id,
  stage,
  kill_node AS node,
  kill_worker AS worker,
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

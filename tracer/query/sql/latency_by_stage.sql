-- latency_by_stage.sql: where each stage's task latency goes, phase by phase.
-- Needs tracer_tables.sql. p50 and p95 (nearest-rank) of each phase of
-- tracer_task_latency: waiting (in the runner), scheduling (Ray), running,
-- pickup (until the runner saw the result) and total (created -> received).
WITH metric_value AS (
  SELECT stage_id, 'waiting' AS metric, waiting_ns AS v
  FROM tracer_task_latency WHERE waiting_ns IS NOT NULL
  UNION ALL
  SELECT stage_id, 'scheduling', scheduling_ns
  FROM tracer_task_latency WHERE scheduling_ns IS NOT NULL
  UNION ALL
  SELECT stage_id, 'running', running_ns
  FROM tracer_task_latency WHERE running_ns IS NOT NULL
  UNION ALL
  SELECT stage_id, 'pickup', pickup_ns
  FROM tracer_task_latency WHERE pickup_ns IS NOT NULL
  UNION ALL
  SELECT stage_id, 'total', total_ns
  FROM tracer_task_latency WHERE total_ns IS NOT NULL
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
    MAX(CASE WHEN metric = 'waiting' AND pick = (50 * n + 99) / 100 THEN v END) AS waiting_p50_ns,
    MAX(CASE WHEN metric = 'waiting' AND pick = (95 * n + 99) / 100 THEN v END) AS waiting_p95_ns,
    MAX(CASE WHEN metric = 'scheduling' AND pick = (50 * n + 99) / 100 THEN v END)
      AS scheduling_p50_ns,
    MAX(CASE WHEN metric = 'scheduling' AND pick = (95 * n + 99) / 100 THEN v END)
      AS scheduling_p95_ns,
    MAX(CASE WHEN metric = 'running' AND pick = (50 * n + 99) / 100 THEN v END) AS running_p50_ns,
    MAX(CASE WHEN metric = 'running' AND pick = (95 * n + 99) / 100 THEN v END) AS running_p95_ns,
    MAX(CASE WHEN metric = 'pickup' AND pick = (50 * n + 99) / 100 THEN v END) AS pickup_p50_ns,
    MAX(CASE WHEN metric = 'pickup' AND pick = (95 * n + 99) / 100 THEN v END) AS pickup_p95_ns,
    MAX(CASE WHEN metric = 'total' AND pick = (50 * n + 99) / 100 THEN v END) AS total_p50_ns,
    MAX(CASE WHEN metric = 'total' AND pick = (95 * n + 99) / 100 THEN v END) AS total_p95_ns
  FROM ranked
  GROUP BY stage_id
),
per_stage AS (
  SELECT stage_id, MIN(stage) AS stage, COUNT(*) AS tasks
  FROM tracer_task_latency
  GROUP BY stage_id
)
SELECT
  s.stage_id,
  s.stage,
  s.tasks,
  p.waiting_p50_ns,
  p.waiting_p95_ns,
  p.scheduling_p50_ns,
  p.scheduling_p95_ns,
  p.running_p50_ns,
  p.running_p95_ns,
  p.pickup_p50_ns,
  p.pickup_p95_ns,
  p.total_p50_ns,
  p.total_p95_ns
FROM per_stage AS s
LEFT JOIN pct AS p ON p.stage_id IS s.stage_id
ORDER BY s.stage_id;

-- latency_by_stage.sql: where each stage's task latency goes, phase by phase.
-- Needs tracer_tables.sql. p50 and p95 (nearest-rank) of each phase of
-- tracer_task_latency: waiting (in the runner), scheduling (Ray), running,
-- pickup (until the runner saw the result) and total (created -> received),
-- then of Ray's parts of scheduling and pickup where the trace has Ray's
-- events (sched_* and pickup_*, see tracer_tables.sql). Percentiles of the
-- parts do not add up to the percentile of the phase: each is the
-- distribution of that part alone.
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
  UNION ALL
  SELECT stage_id, 'sched_queue', sched_queue_ns
  FROM tracer_task_latency WHERE sched_queue_ns IS NOT NULL
  UNION ALL
  SELECT stage_id, 'sched_push', sched_push_ns
  FROM tracer_task_latency WHERE sched_push_ns IS NOT NULL
  UNION ALL
  SELECT stage_id, 'sched_args', sched_args_ns
  FROM tracer_task_latency WHERE sched_args_ns IS NOT NULL
  UNION ALL
  SELECT stage_id, 'sched_start', sched_start_ns
  FROM tracer_task_latency WHERE sched_start_ns IS NOT NULL
  UNION ALL
  SELECT stage_id, 'pickup_store', pickup_store_ns
  FROM tracer_task_latency WHERE pickup_store_ns IS NOT NULL
  UNION ALL
  SELECT stage_id, 'pickup_notify', pickup_notify_ns
  FROM tracer_task_latency WHERE pickup_notify_ns IS NOT NULL
  UNION ALL
  SELECT stage_id, 'pickup_loop', pickup_loop_ns
  FROM tracer_task_latency WHERE pickup_loop_ns IS NOT NULL
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
    MAX(CASE WHEN metric = 'total' AND pick = (95 * n + 99) / 100 THEN v END) AS total_p95_ns,
    MAX(CASE WHEN metric = 'sched_queue' AND pick = (50 * n + 99) / 100 THEN v END)
      AS sched_queue_p50_ns,
    MAX(CASE WHEN metric = 'sched_queue' AND pick = (95 * n + 99) / 100 THEN v END)
      AS sched_queue_p95_ns,
    MAX(CASE WHEN metric = 'sched_push' AND pick = (50 * n + 99) / 100 THEN v END)
      AS sched_push_p50_ns,
    MAX(CASE WHEN metric = 'sched_push' AND pick = (95 * n + 99) / 100 THEN v END)
      AS sched_push_p95_ns,
    MAX(CASE WHEN metric = 'sched_args' AND pick = (50 * n + 99) / 100 THEN v END)
      AS sched_args_p50_ns,
    MAX(CASE WHEN metric = 'sched_args' AND pick = (95 * n + 99) / 100 THEN v END)
      AS sched_args_p95_ns,
    MAX(CASE WHEN metric = 'sched_start' AND pick = (50 * n + 99) / 100 THEN v END)
      AS sched_start_p50_ns,
    MAX(CASE WHEN metric = 'sched_start' AND pick = (95 * n + 99) / 100 THEN v END)
      AS sched_start_p95_ns,
    MAX(CASE WHEN metric = 'pickup_store' AND pick = (50 * n + 99) / 100 THEN v END)
      AS pickup_store_p50_ns,
    MAX(CASE WHEN metric = 'pickup_store' AND pick = (95 * n + 99) / 100 THEN v END)
      AS pickup_store_p95_ns,
    MAX(CASE WHEN metric = 'pickup_notify' AND pick = (50 * n + 99) / 100 THEN v END)
      AS pickup_notify_p50_ns,
    MAX(CASE WHEN metric = 'pickup_notify' AND pick = (95 * n + 99) / 100 THEN v END)
      AS pickup_notify_p95_ns,
    MAX(CASE WHEN metric = 'pickup_loop' AND pick = (50 * n + 99) / 100 THEN v END)
      AS pickup_loop_p50_ns,
    MAX(CASE WHEN metric = 'pickup_loop' AND pick = (95 * n + 99) / 100 THEN v END)
      AS pickup_loop_p95_ns
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
  p.total_p95_ns,
  p.sched_queue_p50_ns,
  p.sched_queue_p95_ns,
  p.sched_push_p50_ns,
  p.sched_push_p95_ns,
  p.sched_args_p50_ns,
  p.sched_args_p95_ns,
  p.sched_start_p50_ns,
  p.sched_start_p95_ns,
  p.pickup_store_p50_ns,
  p.pickup_store_p95_ns,
  p.pickup_notify_p50_ns,
  p.pickup_notify_p95_ns,
  p.pickup_loop_p50_ns,
  p.pickup_loop_p95_ns
FROM per_stage AS s
LEFT JOIN pct AS p ON p.stage_id IS s.stage_id
ORDER BY s.stage_id;

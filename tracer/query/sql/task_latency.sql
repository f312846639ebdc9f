-- task_latency.sql: every task attempt with the four phases of its latency.
-- Needs tracer_tables.sql. Phases (ns): waiting (created -> dispatched, in the
-- runner), scheduling (dispatched -> started, Ray), running (the task body),
-- pickup (finished -> received by the runner); total = created -> received.
SELECT
  task_id,
  attempt,
  stage_id,
  stage,
  status,
  node,
  worker,
  created_ts,
  waiting_ns,
  scheduling_ns,
  running_ns,
  pickup_ns,
  total_ns,
  memory_requested,
  memory_peak
FROM tracer_task_latency
ORDER BY created_ts, task_id, attempt;

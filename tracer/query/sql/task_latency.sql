-- task_latency.sql: every task attempt with the four phases of its latency.
-- Needs tracer_tables.sql. Phases (ns): waiting (created -> dispatched, in the
-- runner), scheduling (dispatched -> started, Ray), running (the task body),
-- pickup (finished -> received by the runner); total = created -> received;
-- then Ray's parts of scheduling and pickup (sched_*, pickup_*: NULL where the
-- trace lacks the Ray events they need; see tracer_tables.sql). peak_source:
-- what memory_peak is ('heap', 'uss', 'rss'; NULL without a peak).
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
  memory_peak,
  peak_source,
  sched_queue_ns,
  sched_push_ns,
  sched_args_ns,
  sched_start_ns,
  pickup_store_ns,
  pickup_notify_ns,
  pickup_loop_ns
FROM tracer_task_latency
ORDER BY created_ts, task_id, attempt;

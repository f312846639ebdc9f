-- memory_flagged.sql: the tasks whose measured peak exceeded their memory
-- request (tasks that requested no memory are not flagged; see
-- memory_by_stage.sql's no_request). Needs tracer_views.sql. Worst first.
SELECT
  task_id,
  attempt,
  stage_id,
  stage,
  node,
  worker,
  memory_requested AS requested_bytes,
  memory_peak AS peak_bytes,
  memory_peak - memory_requested AS excess_bytes,
  CAST(memory_peak AS REAL) / memory_requested AS ratio
FROM tracer_task_latency
WHERE memory_requested > 0 AND memory_peak > memory_requested
ORDER BY excess_bytes DESC, task_id, attempt;

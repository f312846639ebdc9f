-- task_failures.sql: the task attempts that failed or were cancelled, in the order they
-- were created, with the error recorded on the task's slice. Needs tracer_tables.sql.
--   status       failed or cancelled
--   error_type   the error's type (OutOfMemoryError, ValueError, ...)
--   error        its text as recorded
SELECT
  t.task_id,
  t.attempt,
  t.stage_id,
  t.stage,
  t.status,
  EXTRACT_ARG(s.arg_set_id, 'debug.error_type') AS error_type,
  EXTRACT_ARG(s.arg_set_id, 'debug.error') AS error
FROM tracer_task AS t
JOIN slice AS s ON s.id = t.slice_id
WHERE t.status IN ('failed', 'cancelled')
ORDER BY t.created_ts, t.slice_id;

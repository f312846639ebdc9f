-- dispatch_loop.sql: where the dispatch loop's time goes.
-- Standalone (reads the slice table only). One row per phase of the loop:
--   plan polling, batching, dispatching, awaiting, no-op task
--       count, and total_ns of their own time (a phase nested in another,
--       like plan polling inside batching, counts for itself only);
--   gaps in waves
--       time inside wave slices outside every phase (handling ready tasks,
--       fetching task measurements, the runner's own bookkeeping);
--   gaps between waves
--       time in the loop's execution slice outside waves and phases.
-- share is total_ns over the execution slice(s): the rows add up to 1.
-- A slice left open by a truncated trace ends at the trace's last event.
WITH trace_end AS (
  SELECT MAX(ts + MAX(dur, 0)) AS ts FROM slice
),
loop AS (
  SELECT
    s.id,
    s.name,
    s.parent_id,
    CASE WHEN s.dur >= 0 THEN s.dur ELSE (SELECT ts FROM trace_end) - s.ts END AS dur
  FROM slice AS s
  WHERE s.category = 'scheduler'
    AND s.name IN (
      'execution', 'wave', 'plan polling', 'batching', 'dispatching', 'awaiting', 'no-op task'
    )
),
phase AS (
  SELECT l.id, l.name, l.parent_id, l.dur, parent.name AS parent_name
  FROM loop AS l
  LEFT JOIN slice AS parent ON parent.id = l.parent_id
  WHERE l.name IN ('plan polling', 'batching', 'dispatching', 'awaiting', 'no-op task')
),
nested AS (
  SELECT parent_id, SUM(dur) AS dur FROM phase GROUP BY parent_id
),
own AS (
  SELECT p.name, p.parent_name, p.dur, p.dur - COALESCE(n.dur, 0) AS own_ns
  FROM phase AS p
  LEFT JOIN nested AS n ON n.parent_id = p.id
),
totals AS (
  SELECT
    (SELECT COALESCE(SUM(dur), 0) FROM loop WHERE name = 'execution') AS span,
    (SELECT COALESCE(SUM(dur), 0) FROM loop WHERE name = 'wave') AS waves,
    (SELECT COALESCE(SUM(dur), 0) FROM own WHERE parent_name = 'wave') AS in_waves,
    (
      SELECT COALESCE(SUM(dur), 0) FROM own
      WHERE parent_name IS NULL
        OR parent_name NOT IN (
          'wave', 'plan polling', 'batching', 'dispatching', 'awaiting', 'no-op task'
        )
    ) AS outside_waves
),
phase_row AS (
  SELECT name AS phase, COUNT(*) AS count, SUM(own_ns) AS total_ns FROM own GROUP BY name
  UNION ALL
  SELECT 'gaps in waves', NULL, waves - in_waves FROM totals
  UNION ALL
  SELECT 'gaps between waves', NULL, span - waves - outside_waves FROM totals
)
SELECT
  r.phase,
  r.count,
  r.total_ns,
  CAST(r.total_ns AS REAL) / r.count AS mean_ns,
  CAST(r.total_ns AS REAL) / t.span AS share
FROM phase_row AS r, totals AS t
ORDER BY
  CASE r.phase
    WHEN 'plan polling' THEN 1
    WHEN 'batching' THEN 2
    WHEN 'dispatching' THEN 3
    WHEN 'awaiting' THEN 4
    WHEN 'no-op task' THEN 5
    WHEN 'gaps in waves' THEN 6
    ELSE 7
  END;

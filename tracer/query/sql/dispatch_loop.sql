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
  SELECT l.name, l.dur, parent.name AS parent_name
  FROM loop AS l
  LEFT JOIN slice AS parent ON parent.id = l.parent_id
  WHERE l.name IN ('plan polling', 'batching', 'dispatching', 'awaiting', 'no-op task')
),
-- A phase's own time: its slices' time minus that of the phases nested in them.
by_name AS (
  SELECT name, COUNT(*) AS count, SUM(dur) AS dur FROM phase GROUP BY name
),
nested AS (
  SELECT parent_name AS name, SUM(dur) AS dur
  FROM phase
  WHERE parent_name IN ('plan polling', 'batching', 'dispatching', 'awaiting', 'no-op task')
  GROUP BY parent_name
),
totals AS (
  SELECT
    (SELECT COALESCE(SUM(dur), 0) FROM loop WHERE name = 'execution') AS span,
    (SELECT COALESCE(SUM(dur), 0) FROM loop WHERE name = 'wave') AS waves,
    (SELECT COALESCE(SUM(dur), 0) FROM phase WHERE parent_name = 'wave') AS in_waves,
    (
      SELECT COALESCE(SUM(dur), 0) FROM phase
      WHERE parent_name IS NULL
        OR parent_name NOT IN (
          'wave', 'plan polling', 'batching', 'dispatching', 'awaiting', 'no-op task'
        )
    ) AS outside_waves
),
phase_row AS (
  SELECT b.name AS phase, b.count, b.dur - COALESCE(n.dur, 0) AS total_ns
  FROM by_name AS b
  LEFT JOIN nested AS n ON n.name = b.name
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

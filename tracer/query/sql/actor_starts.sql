-- actor_starts.sql: one row per stage whose engine started actors for it (Ray Data's
-- actor pools: map_batches with a class), from its 'actor starting' slices (category
-- 'stage', on the stage's 'actors starting' lanes).
--   actors               actors the engine created for the stage
--   ready                of those, the ones it saw ready (no status: not failed, released
--                        before ready, nor still starting at the trace's end)
--   start_p50/max_ns     from an actor's creation until the engine saw it ready (its
--                        __init__ done), of those ready
-- Percentiles are nearest-rank: the value at rank ceil(p * n / 100).
WITH actor AS (
  SELECT
    EXTRACT_ARG(arg_set_id, 'debug.stage_id') AS stage_id,
    EXTRACT_ARG(arg_set_id, 'debug.stage') AS stage,
    EXTRACT_ARG(arg_set_id, 'debug.status') AS status,
    dur
  FROM slice
  WHERE category = 'stage' AND name = 'actor starting'
),
ranked AS (
  SELECT
    stage_id,
    dur,
    ROW_NUMBER() OVER (PARTITION BY stage_id ORDER BY dur) AS pick,
    COUNT(*) OVER (PARTITION BY stage_id) AS n
  FROM actor
  WHERE status IS NULL AND dur >= 0
),
pct AS (
  SELECT
    stage_id,
    COUNT(*) AS ready,
    MAX(CASE WHEN pick = (50 * n + 99) / 100 THEN dur END) AS start_p50_ns,
    MAX(dur) AS start_max_ns
  FROM ranked
  GROUP BY stage_id
),
per_stage AS (
  SELECT stage_id, MIN(stage) AS stage, COUNT(*) AS actors
  FROM actor
  GROUP BY stage_id
)
SELECT
  s.stage_id,
  s.stage,
  s.actors,
  COALESCE(p.ready, 0) AS ready,
  p.start_p50_ns,
  p.start_max_ns
FROM per_stage AS s
LEFT JOIN pct AS p ON p.stage_id IS s.stage_id
ORDER BY s.stage_id;

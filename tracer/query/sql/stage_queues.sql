-- stage_queues.sql: one row per stage whose engine queues its input and holds it back
-- (Ray Data), from the stage slices' END args, as sampled at its scheduling steps.
--   queued_blocks_max    the most blocks queued at the stage's input at once
--   backpressured_ns     how long the engine held the stage back in all (backpressure:
--                        its task submissions or its outputs) while blocks were queued
--                        at its input
WITH figures AS (
  SELECT
    EXTRACT_ARG(arg_set_id, 'debug.stage_id') AS stage_id,
    name AS stage,
    EXTRACT_ARG(arg_set_id, 'debug.queued_blocks_max') AS queued,
    EXTRACT_ARG(arg_set_id, 'debug.backpressured_ns') AS held
  FROM slice
  WHERE category = 'stage' AND depth = 0
)
SELECT
  stage_id,
  MIN(stage) AS stage,
  MAX(queued) AS queued_blocks_max,
  SUM(held) AS backpressured_ns
FROM figures
WHERE queued IS NOT NULL OR held IS NOT NULL
GROUP BY stage_id
ORDER BY stage_id;

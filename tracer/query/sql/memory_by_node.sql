-- memory_by_node.sql: measured task memory, one row per node.
-- Needs tracer_tables.sql. Only task attempts with a measured peak count.
--   tasks                measured tasks that ran on the node
--   peak_p50/max_bytes   their peaks (nearest-rank p50)
--   over_request         tasks with a request (> 0) whose peak exceeded it
--   excess_max_bytes     the most a task's peak exceeded its request by
WITH measured AS (
  SELECT * FROM tracer_task_latency WHERE memory_peak IS NOT NULL
),
ranked AS (
  SELECT
    node,
    memory_peak,
    ROW_NUMBER() OVER (PARTITION BY node ORDER BY memory_peak) AS pick,
    COUNT(*) OVER (PARTITION BY node) AS n
  FROM measured
),
pct AS (
  SELECT node, MAX(CASE WHEN pick = (50 * n + 99) / 100 THEN memory_peak END) AS p50
  FROM ranked
  GROUP BY node
),
per_node AS (
  SELECT
    node,
    COUNT(*) AS tasks,
    MAX(memory_peak) AS peak_max_bytes,
    COUNT(
      CASE WHEN memory_requested > 0 AND memory_peak > memory_requested THEN 1 END
    ) AS over_request,
    MAX(
      CASE
        WHEN memory_requested > 0 AND memory_peak > memory_requested
        THEN memory_peak - memory_requested
      END
    ) AS excess_max_bytes
  FROM measured
  GROUP BY node
)
SELECT
  n.node,
  n.tasks,
  p.p50 AS peak_p50_bytes,
  n.peak_max_bytes,
  n.over_request,
  n.excess_max_bytes
FROM per_node AS n
LEFT JOIN pct AS p ON p.node IS n.node
ORDER BY n.node;

-- memory_by_node.sql: measured task memory, one row per node.
-- Needs tracer_tables.sql. Task attempts with a measured peak, and those Ray's
-- OOM killer killed (no peak: the memory their worker used at the kill).
--   tasks                measured tasks that ran on the node
--   peak_p50/max_bytes   their peaks (nearest-rank p50)
--   over_request         tasks with a request (> 0) whose peak exceeded it
--   excess_max_bytes     the most a task's peak exceeded its request by
--   oom_killed           tasks Ray's OOM killer killed there
WITH measured AS (
  SELECT * FROM tracer_task_latency WHERE memory_peak IS NOT NULL
),
killed AS (
  SELECT node, COUNT(*) AS oom_killed
  FROM tracer_task_latency
  WHERE memory_at_kill IS NOT NULL
  GROUP BY node
),
nodes AS (
  SELECT node FROM measured UNION SELECT node FROM killed
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
  a.node,
  COALESCE(n.tasks, 0) AS tasks,
  p.p50 AS peak_p50_bytes,
  n.peak_max_bytes,
  COALESCE(n.over_request, 0) AS over_request,
  n.excess_max_bytes,
  COALESCE(k.oom_killed, 0) AS oom_killed
FROM nodes AS a
LEFT JOIN per_node AS n ON n.node IS a.node
LEFT JOIN pct AS p ON p.node IS a.node
LEFT JOIN killed AS k ON k.node IS a.node
ORDER BY a.node;

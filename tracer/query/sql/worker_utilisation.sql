-- worker_utilisation.sql: how busy each worker was, bucket by bucket.
-- Needs tracer_tables.sql. The run (first to last event of the trace) is cut
-- into `buckets` equal buckets (change the number in `params`); for every
-- worker of every node and every bucket: busy_ns, the time its executions
-- overlap the bucket, and busy_fraction = busy_ns / bucket_ns. start_ns is
-- the bucket's start relative to the start of the trace. busy_with_ray_ns and
-- busy_with_ray_fraction count, beside each execution, Ray's handling of it in
-- the worker where the trace has Ray's events (the execution's 'ray task' span:
-- fetching and deserializing the arguments, storing the outputs): a worker
-- whose tasks return big outputs is busy longer than its executions say. A
-- worker that runs overlapping executions (a threaded actor) can exceed 1.
-- The overlaps come
-- from the stdlib's interval intersection (intervals.intersect), twice as
-- fast as a join of every execution with every bucket on a million tasks.
INCLUDE PERFETTO MODULE intervals.intersect;
WITH RECURSIVE params AS (
  SELECT 20 AS buckets
),
bounds AS (
  SELECT MIN(ts) AS start_ts, MAX(ts + MAX(dur, 0)) AS end_ts FROM slice
),
grid AS (
  SELECT
    b.start_ts,
    p.buckets,
    MAX((b.end_ts - b.start_ts + p.buckets - 1) / p.buckets, 1) AS bucket_ns
  FROM bounds AS b, params AS p
),
bucket(i) AS (
  SELECT 0
  UNION ALL
  SELECT bucket.i + 1 FROM bucket, params WHERE bucket.i + 1 < params.buckets
),
bucket_span AS (
  SELECT b.i AS id, g.start_ts + b.i * g.bucket_ns AS ts, g.bucket_ns AS dur
  FROM bucket AS b, grid AS g
),
execution_span AS (
  SELECT slice_id AS id, start_ts AS ts, dur FROM tracer_execution
),
-- The execution and its Ray span together (the span tracer_ray_match gives it;
-- the execution alone where there is none).
handled AS (
  SELECT
    e.slice_id AS id,
    MIN(e.start_ts, COALESCE(r.start_ts, e.start_ts)) AS start_ts,
    MAX(e.end_ts, COALESCE(r.end_ts, e.end_ts)) AS end_ts
  FROM tracer_execution AS e
  LEFT JOIN tracer_ray_match AS r ON r.execution_slice_id = e.slice_id
),
handled_span AS (
  SELECT id, start_ts AS ts, end_ts - start_ts AS dur FROM handled
),
workers AS (
  SELECT DISTINCT node, worker FROM tracer_execution
),
busy AS (
  SELECT e.node, e.worker, ii.id_0 AS i, SUM(ii.dur) AS busy_ns
  FROM _interval_intersect!((bucket_span, execution_span), ()) AS ii
  JOIN tracer_execution AS e ON e.slice_id = ii.id_1
  GROUP BY e.node, e.worker, ii.id_0
),
busy_with_ray AS (
  SELECT e.node, e.worker, ii.id_0 AS i, SUM(ii.dur) AS busy_ns
  FROM _interval_intersect!((bucket_span, handled_span), ()) AS ii
  JOIN tracer_execution AS e ON e.slice_id = ii.id_1
  GROUP BY e.node, e.worker, ii.id_0
)
SELECT
  w.node,
  w.worker,
  b.i AS bucket,
  b.i * g.bucket_ns AS start_ns,
  g.bucket_ns,
  COALESCE(u.busy_ns, 0) AS busy_ns,
  CAST(COALESCE(u.busy_ns, 0) AS REAL) / g.bucket_ns AS busy_fraction,
  COALESCE(h.busy_ns, 0) AS busy_with_ray_ns,
  CAST(COALESCE(h.busy_ns, 0) AS REAL) / g.bucket_ns AS busy_with_ray_fraction
FROM workers AS w
CROSS JOIN bucket AS b
CROSS JOIN grid AS g
LEFT JOIN busy AS u ON u.node IS w.node AND u.worker IS w.worker AND u.i = b.i
LEFT JOIN busy_with_ray AS h ON h.node IS w.node AND h.worker IS w.worker AND h.i = b.i
ORDER BY w.node, w.worker, b.i;

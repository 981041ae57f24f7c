-- title: Gradient-norm decay slope per worker (latest, last hour)
-- chart: bar worker_id log_slope
SELECT job_id, worker_id, argMax(value, event_time) AS log_slope, max(event_time) AS at
FROM features
WHERE feature = 'grad_norm_log_slope' AND event_time > now() - INTERVAL 1 HOUR
GROUP BY job_id, worker_id
ORDER BY log_slope DESC
LIMIT 50

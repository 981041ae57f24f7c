-- title: Workers whose reward variance jumped in the last hour
-- chart: bar worker_id max_jump_ratio
SELECT job_id, worker_id, max(value) AS max_jump_ratio, argMax(event_time, value) AS at
FROM features
WHERE feature = 'reward_variance_jump_ratio' AND event_time > now() - INTERVAL 1 HOUR
GROUP BY job_id, worker_id
HAVING max_jump_ratio > 4
ORDER BY max_jump_ratio DESC
LIMIT 50

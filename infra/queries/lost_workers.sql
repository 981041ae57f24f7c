-- title: Workers marked lost (last day)
SELECT job_id, worker_id, count() AS times_lost, max(event_time) AS last_lost
FROM features
WHERE feature = 'worker_lost' AND value = 1 AND event_time > now() - INTERVAL 1 DAY
GROUP BY job_id, worker_id
ORDER BY last_lost DESC

-- title: Circuit-breaker trips by hour (last day)
-- chart: line hour trips
SELECT hour, sum(actuations) AS trips
FROM actuations_hourly
WHERE policy_name LIKE '%breaker%' AND hour > now() - INTERVAL 1 DAY
GROUP BY hour
ORDER BY hour

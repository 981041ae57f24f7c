-- title: Actuations by policy and outcome (last day)
-- chart: bar policy_name actuations
SELECT a.policy_name AS policy_name, a.action AS action, count() AS actuations,
       countIf(r.status = 'applied') AS applied, countIf(r.status = 'failed') AS failed,
       countIf(r.status = 'unsupported') AS unsupported, countIf(r.status = 'deferred') AS deferred,
       countIf(r.status IN ('rejected', 'stale', 'superseded')) AS refused
FROM actuations AS a
LEFT JOIN actuation_results AS r ON r.actuation_id = a.actuation_id
WHERE a.event_time > now() - INTERVAL 1 DAY
GROUP BY policy_name, action
ORDER BY actuations DESC

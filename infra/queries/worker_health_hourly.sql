-- title: Mean reward and episode length per worker and hour (last day)
-- chart: line hour reward_mean
SELECT hour, worker_id,
       avgMergeIf(value_avg, feature = 'reward_mean') AS reward_mean,
       avgMergeIf(value_avg, feature = 'episode_length_mean') AS episode_length_mean
FROM features_hourly
WHERE hour > now() - INTERVAL 1 DAY
GROUP BY hour, worker_id
ORDER BY hour, worker_id

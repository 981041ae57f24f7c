-- title: GPUs ranked by memory leak rate on long episodes
-- chart: bar gpu_uuid long_leak_bytes_per_s
SELECT gpu_uuid, any(gpu_model) AS gpu_model,
       sumIf(delta_bytes, regime = 'long') / nullIf(sumIf(delta_s, regime = 'long'), 0)
           AS long_leak_bytes_per_s,
       sumIf(delta_bytes, regime = 'short') / nullIf(sumIf(delta_s, regime = 'short'), 0)
           AS short_leak_bytes_per_s,
       max(thermal_throttle_events) AS thermal_throttle_events,
       count(DISTINCT worker_id) AS workers
FROM gpu_profiles FINAL
GROUP BY gpu_uuid
ORDER BY long_leak_bytes_per_s DESC NULLS LAST
LIMIT 50

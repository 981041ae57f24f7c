"""Feature values of a healthy worker, shared by the policy tests of every tier."""

GIB = 1 << 30
HEALTHY = {
    "reward_episodes": 20.0, "reward_variance_jump_ratio": 1.0,
    "episode_same_end_streak": 1.0, "grad_norm_spike_z": 0.5, "grad_norm_jumps": 0.0,
    "grad_nonfinite_count": 0.0,
    "loss_nonfinite_count": 0.0, "grad_sync_latency_p50_ms": 20.0,
    "grad_sync_latency_p95_ms": 30.0, "grad_sync_latency_p99_ms": 40.0,
    "grad_sync_bytes_per_s": 50e6, "gpu_memory_used_bytes": 5.0 * GIB,
    "gpu_thermal_throttle_events": 0.0, "heartbeat_age_s": 1.0, "worker_lost": 0.0,
    "pool_utilisation_rate": 0.75, "breaker_trips_per_hour": 1.0,
    "snapshot_recovery_time_s": 2.0, "runtime_call_latency_ms": 400.0,
    # a worker's own memory, on a card it shares: the card holds more than its quota
    "gpu_process_memory_bytes": 6.5 * GIB, "gpu_thermal_throttled": 0.0,
    "card_thermal_throttled": 0.0,
    # runs of common endings and spread in the returns, as chance brings them often
    "episode_end_streak_chance_per_h": 40.0, "reward_volatility_chance_per_h": 25.0,
}
HEALTHY["gpu_memory_used_bytes"] = 13.0 * GIB
# A run of an ending rare for the worker: once in 100,000 worker-hours by chance.
STUCK = {"episode_same_end_streak": 3.0, "episode_end_streak_chance_per_h": 1e-5}

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
}

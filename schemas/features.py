"""Feature events: what the stream jobs derive per worker (and per GPU), and per pool and
per job (fleet features).

A fleet feature event is a ``FeatureEvent`` with ``scope="pool"`` (or ``"job"``) whose
identity is ``fleet_identity(job_id, pool)``: the pool stands where a worker would
(``worker_id="pool:<pool>"``, ``node_id="fleet"``, ``pool=<pool>``; ``worker_id="job"``
and no pool for a whole job), keyed by that ``worker_id`` on the features topic, its
``window`` the time window its values cover (``"1h"``), its features named in
``FLEET_FEATURES`` and its tags ``{"pool": <pool>}``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dsec.schemas.base import UINT32_MAX, Count, Event, Identifier, Model, WorkerIdentity

FeatureName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
TagValue = Annotated[str, Field(max_length=128)]
# Every consumer compares and stores feature values: NaN and ±Inf are refused.
FeatureValue = Annotated[float, Field(allow_inf_nan=False)]


class RegimeGrowth(Model):
    """Device memory change observed while a worker ran in one episode-length regime."""

    delta_bytes: float
    delta_s: Annotated[float, Field(ge=0)]


Regime = Literal["short", "medium", "long"]
# What a feature event describes: one worker, one resource pool, or one whole job.
FeatureScope = Literal["worker", "pool", "job"]
FLEET_NODE = "fleet"


def fleet_identity(job_id: str, pool: str | None = None) -> WorkerIdentity:
    """The identity of a fleet feature event for ``pool`` of ``job_id`` (the whole job when
    ``pool`` is None)."""
    return WorkerIdentity(job_id=job_id, worker_id=f"pool:{pool}" if pool else "job",
                          node_id=FLEET_NODE, pool=pool)


class GpuProfileEvent(Event):
    """One worker's running contribution to a GPU's "personality": cumulative totals, so
    the latest event per (GPU, worker) replaces the ones before it."""

    gpu_uuid: Identifier
    gpu_model: Annotated[str, Field(max_length=128)] = ""
    identity: WorkerIdentity
    regimes: dict[Regime, RegimeGrowth]
    thermal_throttle_events: Annotated[int, Field(ge=0, le=UINT32_MAX)] = 0
    bandwidth_jitter: Annotated[float, Field(ge=0)] = 0.0
    samples: Count = 0


class FeatureEvent(Event):
    identity: WorkerIdentity
    scope: FeatureScope = "worker"
    gpu_uuid: Identifier | None = None
    window: Annotated[str, Field(max_length=64)] = ""
    features: Annotated[dict[FeatureName, FeatureValue], Field(max_length=256)]
    # Text context of the target (pool, gpu_model, worker labels, episode_end_reason):
    # policy selectors match on it and alerts name it; conditions only see ``features``.
    tags: Annotated[dict[FeatureName, TagValue], Field(max_length=32)] = Field(default_factory=dict)

    def target_pool(self) -> str | None:
        """The pool the event's target runs in: its identity's, else its ``pool`` tag."""
        return self.identity.pool or self.tags.get("pool") or None


# The feature catalogue: every name the stream jobs publish, with its unit. Policies are
# written against these names; a name's meaning and unit never change within a version.
WORKER_FEATURES: dict[str, str] = {
    "episodes_total": "episodes the worker reported since the stream job first saw it (count)",
    "steps_total": "optimizer steps the worker reported since first seen (count)",
    "reward_mean": "mean episode return over the last N episodes",
    "reward_variance": "sample variance of the episode return over the last N episodes",
    "reward_episodes": "episodes in the reward window (count)",
    "reward_variance_jump_ratio": "reward variance of this window over the previous one",
    "reward_variance_time_window": "reward variance over the last time window (60 s default)",
    "reward_time_window_episodes": "episodes the time-window variance is taken over: those of "
                                   "the last 60 s, at least 3 and at most 20 (count)",
    "reward_volatility_ratio": "sample variance of the returns of the time window over that "
                               "of the returns kept before it, up to 40 episodes back (ratio)",
    "reward_volatility_chance_per_h": "how often per hour a variance ratio that large would "
                                      "come by chance (its F-test tail probability times "
                                      "the worker's episodes per hour)",
    "episode_length_mean": "mean episode length over the window (steps)",
    "episode_length_cv": "coefficient of variation of the episode length (ratio)",
    "episode_same_end_streak": "consecutive episodes that ended with the same reason (count)",
    "episode_end_streak_chance_per_h": "how often per hour a run that long of that ending "
                                       "would come by chance: the ending's largest likely "
                                       "share (95 % upper bound) of the worker's last 200 "
                                       "endings before the run, to the run's length, times "
                                       "the worker's episodes per hour",
    "grad_norm": "latest gradient L2 norm",
    "grad_norm_log_slope": "least-squares slope of log(grad norm) against step (1/step)",
    "grad_norm_jumps": "swings of the gradient norm by 20x or more between consecutive "
                       "steps (micro-steps while accumulating), over the last 32 (count)",
    "grad_norm_spike_z": "largest robust z-score (median, 1.4826 MAD) of the batch's new "
                         "gradient norms, against the window before the batch",
    "grad_nonfinite_count": "steps with NaN/Inf gradients in the window (count)",
    "loss_nonfinite_count": "steps with a NaN/Inf loss in the window (count)",
    "grad_sync_latency_p50_ms": "gradient sync latency, median (ms)",
    "grad_sync_latency_p95_ms": "gradient sync latency, 95th percentile (ms)",
    "grad_sync_latency_p99_ms": "gradient sync latency, 99th percentile (ms)",
    "grad_sync_bytes_per_s": "gradient upload rate over the window (bytes/s)",
    "grad_sync_success_rate": "successful syncs over all syncs in the window (ratio)",
    "grad_sync_bandwidth_jitter": "coefficient of variation of per-sync throughput (ratio)",
    "gpu_memory_used_bytes": "latest card-wide device memory in use, every process on the "
                             "card (bytes; the fullest of the worker's GPUs)",
    "gpu_memory_growth_bytes_per_s": "least-squares growth of card-wide device memory in use "
                                     "over the last 64 samples (bytes/s; the fastest GPU)",
    "gpu_process_memory_bytes": "device memory the worker's own process holds: NVML's "
                                "per-process figure or the CUDA allocator's reserved bytes, "
                                "the larger (bytes; summed over its GPUs)",
    "gpu_utilisation_pct": "latest device utilisation (percent; the mean of the worker's GPUs)",
    "gpu_temperature_c": "latest device temperature (degrees C; the hottest GPU)",
    "gpu_thermal_throttle_events": "onsets of thermal clock throttling since the stream job "
                                   "first saw the GPU (count; summed over the worker's GPUs)",
    "gpu_thermal_throttled": "1 while a GPU the worker samples throttles for heat, else 0",
    "card_thermal_throttled": "1 while the worker's card throttles for heat by any sampling "
                              "process on it, else 0 (from the card job)",
    "card_workers": "workers the card job knows on the worker's card (count)",
    "cuda_memory_allocated_bytes": "CUDA allocator's bytes in tensors (bytes; its devices)",
    "cuda_memory_reserved_bytes": "CUDA allocator's bytes reserved (bytes; its devices)",
    "cuda_memory_fragmentation_ratio": "reserved bytes holding no tensor, of those reserved "
                                       "(ratio)",
    "cuda_oom_count": "out-of-memory errors the CUDA allocator reported (count)",
    "heartbeat_age_s": "seconds since the worker's last heartbeat",
    "worker_lost": "1 when silent for 3 heartbeat intervals while others go on, else 0",
    "step_stalled_heartbeats": "heartbeats in a row whose step count did not move, once the "
                               "worker has stepped (count)",
    "step_stalled_s": "seconds since the step count the heartbeats carry last moved, while "
                      "it stalls (0 while it moves)",
    "probe_samples_dropped": "samples the probe dropped since it started (count)",
    "last_recovery_time_s": "how long the worker's last resume took (s)",
    "recoveries_total": "resumes the worker reported since first seen, any source (count)",
    "snapshot_recoveries_total": "resumes from a snapshot since first seen (count)",
    "snapshot_recovery_time_s_total": "time the resumes from a snapshot took in all (s)",
    "step_time_s_total": "time covered by timed steps since first seen: each step sample's "
                         "mean step time times the steps since the sample before (s)",
    "grad_syncs_total": "gradient syncs the worker reported since first seen (count)",
    "grad_syncs_failed_total": "failed gradient syncs since first seen (count)",
    "gpu_oom_total": "out-of-memory errors the CUDA allocator counted since the worker's "
                     "process started (count)",
    # a platform runtime's latest report (registration or posted runtime sample)
    "runtime_call_latency_ms": "the runtime's mean call latency (ms)",
    "runtime_concurrency": "the calls the runtime runs at once (count)",
    "runtime_call_latency_per_slot_ms": "mean call latency over concurrency (ms)",
    "runtime_function_calling": "1 when the runtime's agents call functions, else 0",
}

# Published per pool and per job (``scope`` "pool" or "job"); the window is the event's.
FLEET_FEATURES: dict[str, str] = {
    "pool_utilisation_rate": "mean device utilisation over the pool (ratio 0..1)",
    "breaker_trips_per_hour": "circuit-breaker trips in the last hour (count)",
    "interruptions_per_hour": "workers lost or resumed after an interruption, last hour (count)",
    "snapshot_recovery_time_s": "mean time to resume from a snapshot, last hour (s)",
    "fleet_grad_sync_success_rate": "successful gradient syncs over all syncs of the scope's "
                                    "workers in the window (ratio)",
    "effective_training_time_ratio": "productive step time over wall time of the scope's "
                                     "workers in the window (ratio 0..1)",
}

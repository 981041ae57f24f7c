"""Per-worker feature state: what one worker's samples add to its windows, and the features
and GPU-profile contributions that follow.

``update`` is pure: a ``WorkerState`` and one batch's frames in, a new state and outputs
out. The state remembers the source offsets it consumed, so an event replayed after a
crash is recognised and not counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from dsec.schemas import WorkerIdentity
from dsec.schemas.frames import Frame
from dsec.schemas.metrics import MICRO_STEP
from dsec.schemas.units import duration_ms, ms_to_s
from dsec.stream_jobs import episode_endings, gpu_features, reward_volatility, silence, stats
from dsec.stream_jobs.step_progress import step_progress
from dsec.stream_jobs.worker_state import (
    RECENT_BATCHES,
    RECENT_OFFSETS,
    EpisodeWindow,
    GpuState,
    Heartbeat,
    Recoveries,
    RegimeGrowthTotals,
    StepWindow,
    SyncWindow,
    WorkerState,
)

__all__ = [
    "GPU_WINDOW", "RECENT_BATCHES", "RECENT_OFFSETS", "FeatureConfig", "GpuContribution", "Update",
    "already_seen", "liveness", "update",
]


# The window of a feature event that holds one GPU's features of a worker on several (the
# worker's own events hold its features over all of them).
GPU_WINDOW = "gpu"


@dataclass(frozen=True)
class FeatureConfig:
    reward_window_episodes: int = 20
    reward_time_window_s: float = 60.0
    grad_window_steps: int = 200
    # A gradient-norm spike is judged once this many norms came before it.
    spike_min_window_steps: int = 32
    # Swings of the gradient norm by jump_ratio or more between consecutive steps (or
    # micro-steps, while the loop accumulates), counted over the last jump_window_steps.
    # Healthy PPO here swung by 20x at most 3 times in 32 steps (by 10x up to 7 times).
    jump_window_steps: int = 32
    jump_ratio: float = 20.0
    # The time window's variance needs this many episodes in it, and this many before it.
    reward_time_window_min_episodes: int = 3
    reward_time_window_min_before: int = 10
    # How many of its endings a worker's run of one ending is judged against, at least.
    end_history_episodes: int = 200
    end_min_history_episodes: int = 5
    sync_window_samples: int = 512
    gpu_window_samples: int = 64
    regime_bounds_steps: tuple[float, float] = (100.0, 300.0)
    lost_after_intervals: float = 3.0
    # An overdue worker is lost after this much more silence on the job's clock: after a
    # stall of the whole input, producers' backlogs come back in no set order.
    lost_grace_s: float = 2.0
    # Past this (beyond the timeout), silence on the job's clock alone loses a worker,
    # though nothing arrives from any other: a stall of the whole input is shorter.
    lost_stall_limit_s: float = 60.0


@dataclass
class GpuContribution:
    gpu_uuid: str
    gpu_model: str
    regimes: dict[str, tuple[float, float]]
    thermal_throttle_events: int
    bandwidth_jitter: float
    samples: int


@dataclass
class Update:
    state: WorkerState
    features: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    gpus: list[GpuContribution] = field(default_factory=list)
    # Per GPU of a worker on several: that GPU's own features (the worker's are in
    # ``features``).
    gpu_features: dict[str, dict[str, float]] = field(default_factory=dict)
    skipped: bool = False


def _tail(values: list, new: np.ndarray | list, capacity: int) -> list:
    """The newest ``capacity`` of ``values`` followed by ``new`` (as plain JSON-able numbers)."""
    new = new[-capacity:]
    combined = [*values, *(new.tolist() if isinstance(new, np.ndarray) else new)]
    return combined[-capacity:]


def already_seen(state: WorkerState, partition: int, offset: int) -> bool:
    """Whether this worker's state already holds the event at ``offset``.

    A window of the last offsets rather than a high-water mark: after a rebalance a
    consumer can be handed one prefetched event ahead of its committed position before it
    reads on from that position, and the events in between must still count. Below a full
    window everything counts as seen (a replay reaches back only to the last commit).
    """
    recent = state.recent_offsets.get(partition)
    if recent is None:
        return False
    return offset in recent or (len(recent) >= RECENT_OFFSETS and offset < recent[0])


def _remember(state: WorkerState, partition: int, offset: int,
              batch_id: str | None) -> tuple[dict[int, list[int]], list[str]]:
    """The replay memory with this message in it: offsets, batch ids."""
    recent = state.recent_offsets.get(partition, [])
    offsets = {**state.recent_offsets, partition: sorted({*recent, offset})[-RECENT_OFFSETS:]}
    batch_ids = state.recent_batch_ids
    if batch_id is not None:
        batch_ids = [*batch_ids, batch_id][-RECENT_BATCHES:]
    return offsets, batch_ids


def update(
    state: WorkerState,
    frames: dict[str, Frame],
    partition: int,
    offset: int,
    now_ms: int,
    config: FeatureConfig,
    batch_id: str | None = None,
    identity: WorkerIdentity | None = None,
) -> Update:
    """``batch_id``: the message's ``duplicate_key``; a batch already counted (the same
    batch published twice, at two offsets) is skipped, as the sink skips it. ``identity``:
    the worker's, from the message (the state keeps its own where None)."""
    if already_seen(state, partition, offset) or batch_id in state.recent_batch_ids:
        return Update(state=state, skipped=True)
    offsets, batch_ids = _remember(state, partition, offset, batch_id)
    out = Update(state=state)
    episodes, steps, syncs = state.episodes, state.steps, state.syncs
    gpus, jitter, heartbeat = state.gpus, state.bandwidth_jitter, state.heartbeat
    cuda_devices = state.cuda_devices
    if "episode" in frames:
        episodes = _episodes(episodes, frames["episode"], config, out.features)
        if episodes.last_end_reason is not None:
            # Where the worker's episodes keep ending, for alerts such as the stuck-episode one.
            out.tags["episode_end_reason"] = str(episodes.last_end_reason)[:128]
    if "step" in frames:
        steps = _steps(steps, frames["step"], config, out.features)
    if "grad_sync" in frames:
        syncs = _syncs(syncs, frames["grad_sync"], config, out.features)
    if "gpu" in frames:
        gpus, jitter = _gpus(gpus, jitter, episodes.lengths_steps, frames["gpu"], config, out)
    if "cuda_memory" in frames:
        cuda_devices = gpu_features.cuda_devices_after(cuda_devices, frames["cuda_memory"])
        out.features.update(gpu_features.cuda_features(cuda_devices))
    if "gpu" in frames or "cuda_memory" in frames:
        out.features.update(gpu_features.worker_gpu_features(gpus, cuda_devices))
    if "heartbeat" in frames:
        heartbeat = _heartbeats(heartbeat, frames["heartbeat"], now_ms, out.features)
    if "cuda_memory" in frames and len(frames["cuda_memory"]["oom_count"]):
        # The allocator's own count since the process started: placement counts its rises.
        out.features["gpu_oom_total"] = float(frames["cuda_memory"]["oom_count"].max())
    recoveries = state.recoveries
    if "recovery" in frames:
        recoveries = _recoveries(recoveries, frames["recovery"], out)
    # One record made once: a frozen record is costly to copy field by field per message.
    out.state = WorkerState(
        identity=state.identity if identity is None else identity, partition=partition,
        recent_offsets=offsets, recent_batch_ids=batch_ids, episodes=episodes, steps=steps,
        syncs=syncs, gpus=gpus, bandwidth_jitter=jitter, heartbeat=heartbeat,
        cuda_devices=cuda_devices, cards=state.cards, recoveries=recoveries)
    return out


def _recoveries(before: Recoveries, frame: Frame, out: Update) -> Recoveries:
    """Counts the resumes; those from a snapshot with their time, for the fleet's snapshot
    recovery time."""
    times_s = frame["recovery_time_s"]
    from_snapshot = frame["source"] == "snapshot"
    after = Recoveries(
        total=before.total + int(times_s.size),
        from_snapshot=before.from_snapshot + int(from_snapshot.sum()),
        from_snapshot_s=before.from_snapshot_s + float(times_s[from_snapshot].sum()),
    )
    out.features["last_recovery_time_s"] = float(times_s[-1])
    out.features["recoveries_total"] = float(after.total)
    out.features["snapshot_recoveries_total"] = float(after.from_snapshot)
    out.features["snapshot_recovery_time_s_total"] = after.from_snapshot_s
    out.tags["recovery_source"] = str(frame["source"][-1])
    return after


def _episodes(window: EpisodeWindow, frame: Frame, config: FeatureConfig,
              out: dict[str, float]) -> EpisodeWindow:
    size = config.reward_window_episodes
    rewards = _tail(window.rewards, frame["reward"], 2 * size)
    reward_times_ms = _tail(window.reward_times_ms, frame["event_time_ms"], 2 * size)
    lengths = _tail(window.lengths_steps, frame["length"], size)
    episodes_total = window.episodes_total + int(frame["reward"].size)
    out["episodes_total"] = float(episodes_total)
    out.update(stats.reward_window_features(rewards, size))
    times = np.asarray(reward_times_ms, dtype=np.int64)
    recent = np.asarray(rewards)[times >= times.max() - duration_ms(config.reward_time_window_s)]
    out["reward_variance_time_window"] = stats.mean_variance(recent.tolist()).variance
    rate_per_hour = episode_endings.episodes_per_hour(reward_times_ms)
    out.update(reward_volatility.volatility_features(
        rewards, reward_times_ms, config.reward_time_window_s,
        config.reward_time_window_min_episodes, size, config.reward_time_window_min_before,
        rate_per_hour))
    lengths_array = np.asarray(lengths, dtype=np.float64)
    out["episode_length_mean"] = float(lengths_array.mean())
    out["episode_length_cv"] = stats.coefficient_of_variation(lengths_array)
    reasons = frame["termination_reason"].tolist()
    streak, last = episode_endings.next_streak(
        window.same_end_streak_episodes, window.last_end_reason, reasons)
    out["episode_same_end_streak"] = float(streak if last is not None else 0)
    history = _tail(window.end_reasons, ["" if r is None else str(r) for r in reasons],
                    config.end_history_episodes)
    out.update(episode_endings.end_features(
        history, streak, last, rate_per_hour, config.end_min_history_episodes))
    return EpisodeWindow(rewards=rewards, reward_times_ms=reward_times_ms,
                         lengths_steps=lengths, episodes_total=episodes_total,
                         same_end_streak_episodes=streak, last_end_reason=last,
                         end_reasons=history)


def _steps(window: StepWindow, frame: Frame, config: FeatureConfig,
           out: dict[str, float]) -> StepWindow:
    size = config.grad_window_steps
    # A micro-step's sample (the loop accumulating gradients) carries its backward's norm
    # and is not a step of its own.
    micro = frame["grad_norm_source"] == MICRO_STEP
    micro_count = int(np.count_nonzero(micro))
    steps_total = window.steps_total + int(frame["step"].size) - micro_count
    out["steps_total"] = float(steps_total)
    step_time_s_total, last_step = _step_time(window, frame, ~micro if micro_count else None)
    if step_time_s_total != window.step_time_s_total:
        out["step_time_s_total"] = step_time_s_total
    norms, steps = frame["grad_norm"], frame["step"]
    has_norm = np.isfinite(norms)
    new_count = int(np.count_nonzero(has_norm))
    if new_count < norms.size:
        norms, steps = norms[has_norm], steps[has_norm]
    new = StepWindow(
        steps_total=steps_total,
        grad_norm_steps=_tail(window.grad_norm_steps, steps, size),
        grad_norms=_tail(window.grad_norms, norms, size),
        grad_nonfinite_flags=_tail(window.grad_nonfinite_flags,
                                   frame["grad_nonfinite"][-size:].astype(np.int8), size),
        loss_nonfinite_flags=_tail(window.loss_nonfinite_flags,
                                   frame["loss_nonfinite"][-size:].astype(np.int8), size),
        step_time_s_total=step_time_s_total, last_sampled_step=last_step,
    )
    out["grad_nonfinite_count"] = float(sum(new.grad_nonfinite_flags))
    out["loss_nonfinite_count"] = float(sum(new.loss_nonfinite_flags))
    if not new.grad_norms:
        return new
    # The window as arrays: the new values themselves where they fill it.
    if new_count >= size:
        window_norms, window_steps = norms[-size:], steps[-size:]
    else:
        window_norms, window_steps = np.asarray(new.grad_norms), np.asarray(new.grad_norm_steps)
    out["grad_norm"] = float(window_norms[-1])
    out["grad_norm_jumps"] = float(stats.jump_count(
        window_norms[-(config.jump_window_steps + 1):], config.jump_ratio))
    out["grad_norm_spike_z"] = stats.spike_z(
        window_norms, new_count, config.grad_window_steps, config.spike_min_window_steps)
    slope = stats.log_slope(window_steps, window_norms)
    if slope is not None:
        out["grad_norm_log_slope"] = slope
    return new


def _step_time(window: StepWindow, frame: Frame,
               sampled: np.ndarray | None) -> tuple[float, int | None]:
    """The step time covered so far, and the last sampled step: a step sample's step time
    is the mean over the steps since the sample before, so it covers that many steps.
    ``sampled``: the samples that are steps (None: all of them)."""
    steps, times_ms = frame["step"], frame["step_time_ms"]
    if sampled is not None:
        steps, times_ms = steps[sampled], times_ms[sampled]
    if not steps.size:
        return window.step_time_s_total, window.last_sampled_step
    before = window.last_sampled_step
    covered = np.empty_like(steps)
    covered[0] = 0 if before is None else steps[0] - before
    np.subtract(steps[1:], steps[:-1], out=covered[1:])
    np.maximum(covered, 0, out=covered)
    known = np.isfinite(times_ms)
    if not known.all():
        times_ms, covered = times_ms[known], covered[known]
    added_ms = float(times_ms @ covered)
    return window.step_time_s_total + ms_to_s(added_ms), int(steps[-1])


def _syncs(window: SyncWindow, frame: Frame, config: FeatureConfig,
           out: dict[str, float]) -> SyncWindow:
    size = config.sync_window_samples
    new = SyncWindow(
        latency_ms=_tail(window.latency_ms, frame["latency_ms"], size),
        sizes_bytes=_tail(window.sizes_bytes, frame["bytes"], size),
        ok_flags=_tail(window.ok_flags, frame["ok"].astype(np.int8), size),
        times_ms=_tail(window.times_ms, frame["event_time_ms"], size),
        syncs_total=window.syncs_total + int(frame["ok"].size),
        syncs_failed_total=window.syncs_failed_total + int((~frame["ok"]).sum()),
    )
    out["grad_syncs_total"] = float(new.syncs_total)
    out["grad_syncs_failed_total"] = float(new.syncs_failed_total)
    latency = np.asarray(new.latency_ms, dtype=np.float64)
    p50, p95, p99 = stats.percentiles(latency, (50, 95, 99))
    out["grad_sync_latency_p50_ms"] = p50
    out["grad_sync_latency_p95_ms"] = p95
    out["grad_sync_latency_p99_ms"] = p99
    out["grad_sync_success_rate"] = sum(new.ok_flags) / len(new.ok_flags)
    times = np.asarray(new.times_ms, dtype=np.int64)
    span_s = ms_to_s(times.max() - times.min())
    if span_s > 0:
        # The first sync opens the window: its bytes fall before the span starts.
        out["grad_sync_bytes_per_s"] = sum(new.sizes_bytes[1:]) / span_s
    out["grad_sync_bandwidth_jitter"] = stats.throughput_jitter(
        np.asarray(new.sizes_bytes, dtype=np.float64), latency
    )
    return new


def _gpus(gpus: dict[str, GpuState], jitter: float, lengths_steps: list[int], frame: Frame,
          config: FeatureConfig, out: Update) -> tuple[dict[str, GpuState], float]:
    """The GPUs' states and the sync bandwidth jitter their profiles carry."""
    regime = (
        stats.regime_of(sum(lengths_steps) / len(lengths_steps), config.regime_bounds_steps)
        if lengths_steps else "short"
    )
    gpus = dict(gpus)
    jitter = float(out.features.get("grad_sync_bandwidth_jitter", jitter))
    for uuid in dict.fromkeys(frame["gpu_uuid"].tolist()):
        rows = frame["gpu_uuid"] == uuid
        gpu = _gpu(gpus.get(uuid), frame, rows, regime, config)
        gpus[uuid] = gpu
        out.gpus.append(GpuContribution(
            gpu_uuid=uuid, gpu_model=gpu.model,
            regimes={k: (v.delta_bytes, v.delta_s) for k, v in gpu.growth_by_regime.items()},
            thermal_throttle_events=gpu.throttle_onset_count, bandwidth_jitter=jitter,
            samples=gpu.sample_count,
        ))
    if len(gpus) > 1:
        for contribution in out.gpus:
            out.gpu_features[contribution.gpu_uuid] = gpu_features.gpu_features(
                gpus[contribution.gpu_uuid])
    return gpus, jitter


def _gpu(previous: GpuState | None, frame: Frame, rows: np.ndarray, regime: str,
         config: FeatureConfig) -> GpuState:
    """One GPU's state after its rows of ``frame``; the growth interval from its previous
    sample to the first new one counts towards the regime the previous one was in."""
    times, used = frame["event_time_ms"][rows], frame["memory_used_bytes"][rows]
    if previous is None:
        all_times, all_used, regimes = times, used, np.array([regime] * times.size)
        totals: dict[str, RegimeGrowthTotals] = {}
    else:
        all_times = np.concatenate(([previous.last_time_ms], times))
        all_used = np.concatenate(([previous.last_used_bytes], used))
        regimes = np.array([previous.last_regime] + [regime] * times.size)
        totals = dict(previous.growth_by_regime)
    for name, (delta_bytes, delta_s) in stats.growth_by_regime(
        all_times, all_used, regimes
    ).items():
        before = totals.get(name, RegimeGrowthTotals())
        totals[name] = RegimeGrowthTotals(before.delta_bytes + delta_bytes,
                                          before.delta_s + delta_s)
    onsets, throttled = stats.throttle_onsets(
        frame["throttle_reasons"][rows], previous.throttled if previous else False
    )
    size = config.gpu_window_samples
    return GpuState(
        process_used_bytes=_last_finite(frame["process_memory_used_bytes"][rows],
                                        previous.process_used_bytes if previous else None, int),
        temperature_c=_last_finite(frame["temperature_c"][rows],
                                   previous.temperature_c if previous else None, float),
        utilisation_pct=_last_finite(frame["utilisation_pct"][rows],
                                     previous.utilisation_pct if previous else None, float),
        model=str(frame["gpu_model"][rows][-1]),
        last_time_ms=int(times[-1]), last_used_bytes=int(used[-1]), last_regime=regime,
        growth_by_regime=totals,
        throttled=throttled,
        throttle_onset_count=(previous.throttle_onset_count if previous else 0) + onsets,
        sample_count=(previous.sample_count if previous else 0) + int(times.size),
        recent_times_ms=_tail(previous.recent_times_ms if previous else [], times, size),
        recent_used_bytes=_tail(previous.recent_used_bytes if previous else [], used, size),
    )


def _last_finite(values: np.ndarray, before, kind):
    """The last reading that is there (NaN: not read), else the one before."""
    there = values[np.isfinite(values)]
    return kind(there[-1]) if there.size else before


def _heartbeats(previous: Heartbeat, frame: Frame, now_ms: int,
                out: dict[str, float]) -> Heartbeat:
    out["probe_samples_dropped"] = float(frame["samples_dropped"][-1])
    out["heartbeat_age_s"] = 0.0
    out["worker_lost"] = 0.0
    newest_ms = int(frame["event_time_ms"].max())
    if previous.last_event_ms is not None:
        newest_ms = max(newest_ms, previous.last_event_ms)  # an older batch read late
    seen = replace(previous, last_seen_ms=now_ms, interval_s=float(frame["interval_s"][-1]),
                   lost=False, last_event_ms=newest_ms, overdue_since_ms=None)
    return step_progress(seen, frame["step"], now_ms, out)


def liveness(
    state: WorkerState, now_ms: int, config: FeatureConfig, caught_up: bool = True,
    progress_ms: int | None = None,
) -> tuple[WorkerState, dict[str, float] | None]:
    """The worker is lost once silent for ``lost_after_intervals`` heartbeat intervals,
    on the job's clock and in event time against ``progress_ms`` (the stream's progress,
    ``silence.stream_progress_ms`` over the workers held here), then ``lost_grace_s``
    more: returns the new state and the features to publish when that happens (else
    None). The way back is the next heartbeat, handled by ``update``.

    ``caught_up``: whether every message already on the worker's partition has been
    processed. While some wait, silence is not the worker's (its heartbeats may be among
    them): a stream job that falls behind does not declare its workers lost."""
    heartbeat = state.heartbeat
    if heartbeat.last_seen_ms is None or heartbeat.lost or not caught_up:
        return state, None
    verdict = silence.judge_silence(
        last_seen_ms=heartbeat.last_seen_ms, last_event_ms=heartbeat.last_event_ms,
        progress_ms=progress_ms, overdue_since_ms=heartbeat.overdue_since_ms, now_ms=now_ms,
        rule=silence.SilenceRule(config.lost_after_intervals * heartbeat.interval_s,
                                 config.lost_grace_s, config.lost_stall_limit_s))
    judged = replace(heartbeat, lost=verdict.lost,
                     overdue_since_ms=verdict.overdue_since_ms)
    new_state = state if judged == heartbeat else replace(state, heartbeat=judged)
    if not verdict.lost:
        return new_state, None
    age_s = ms_to_s(now_ms - heartbeat.last_seen_ms)
    return new_state, {"worker_lost": 1.0, "heartbeat_age_s": age_s}

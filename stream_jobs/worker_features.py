"""Per-worker feature state: what one worker's samples add to its windows, and the features
and GPU-profile contributions that follow.

The state is a JSON-able dict (it lives in a Faust table); ``update`` is pure: state and
one batch's frames in, new state and outputs out. It remembers the source offsets it
consumed, so an event replayed after a crash is recognised and not counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dsec.schemas.frames import Frame
from dsec.schemas.metrics import MICRO_STEP
from dsec.stream_jobs import stats

State = dict[str, Any]


@dataclass(frozen=True)
class FeatureConfig:
    reward_window_episodes: int = 20
    reward_time_window_s: float = 60.0
    grad_window_steps: int = 200
    # A gradient-norm spike is judged once this many norms came before it.
    spike_min_window: int = 32
    # Swings of the gradient norm by jump_ratio or more between consecutive steps (or
    # micro-steps, while the loop accumulates), counted over the last jump_window_steps.
    # Healthy PPO here swung by 20x at most 3 times in 32 steps (by 10x up to 7 times).
    jump_window_steps: int = 32
    jump_ratio: float = 20.0
    sync_window: int = 512
    gpu_window: int = 64
    regime_bounds_steps: tuple[float, float] = (100.0, 300.0)
    lost_after_intervals: float = 3.0


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
    state: State
    features: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    gpus: list[GpuContribution] = field(default_factory=list)
    skipped: bool = False


def _tail(values: list, new: np.ndarray | list, capacity: int) -> list:
    """The newest ``capacity`` of ``values`` followed by ``new`` (as plain JSON-able numbers)."""
    new = new[-capacity:]
    combined = [*values, *(new.tolist() if isinstance(new, np.ndarray) else new)]
    return combined[-capacity:]


# How many of a worker's source offsets per partition, and of its batch ids, the state
# remembers.
RECENT_OFFSETS = 64
RECENT_BATCHES = 64


def already_seen(state: State, partition: int, offset: int) -> bool:
    """Whether this worker's state already holds the event at ``offset``.

    A window of the last offsets rather than a high-water mark: after a rebalance a
    consumer can be handed one prefetched event ahead of its committed position before it
    reads on from that position, and the events in between must still count. Below a full
    window everything counts as seen (a replay reaches back only to the last commit).
    """
    recent = state.get("recent_offsets", {}).get(str(partition))
    if recent is None:  # a state written before the window: its high-water mark
        seen = state.get("offsets", {}).get(str(partition))
        return seen is not None and offset <= seen
    return offset in recent or (len(recent) >= RECENT_OFFSETS and offset < recent[0])


def _remember(state: State, partition: int, offset: int) -> None:
    windows = state.get("recent_offsets", {})
    legacy = state.get("offsets", {}).get(str(partition))
    recent = windows.get(str(partition), [] if legacy is None else [legacy])
    state["recent_offsets"] = {
        **windows, str(partition): sorted({*recent, offset})[-RECENT_OFFSETS:]}


def update(
    state: State,
    frames: dict[str, Frame],
    partition: int,
    offset: int,
    now_ms: int,
    config: FeatureConfig,
    batch_id: str | None = None,
) -> Update:
    """``batch_id``: the message's ``duplicate_key``; a batch already counted (the same
    batch published twice, at two offsets) is skipped, as the sink skips it."""
    if already_seen(state, partition, offset) or batch_id in state.get("recent_batches", ()):
        return Update(state=state, skipped=True)
    state = dict(state)
    _remember(state, partition, offset)
    if batch_id is not None:
        state["recent_batches"] = [*state.get("recent_batches", []), batch_id][-RECENT_BATCHES:]
    out = Update(state=state)
    if "episode" in frames:
        _episodes(state, frames["episode"], config, out.features)
        if state.get("last_end_reason") is not None:
            # Where the worker's episodes keep ending, for alerts such as the stuck-episode one.
            out.tags["episode_end_reason"] = str(state["last_end_reason"])[:128]
    if "step" in frames:
        _steps(state, frames["step"], config, out.features)
    if "grad_sync" in frames:
        _syncs(state, frames["grad_sync"], config, out.features)
    if "gpu" in frames:
        _gpus(state, frames["gpu"], config, out)
    if "heartbeat" in frames:
        _heartbeats(state, frames["heartbeat"], now_ms, out.features)
    if "recovery" in frames:
        recoveries = frames["recovery"]["recovery_time_s"]
        out.features["last_recovery_time_s"] = float(recoveries[-1])
    return out


def _episodes(state: State, frame: Frame, config: FeatureConfig, out: dict[str, float]) -> None:
    window = config.reward_window_episodes
    state["rewards"] = _tail(state.get("rewards", []), frame["reward"], 2 * window)
    state["reward_times_ms"] = _tail(
        state.get("reward_times_ms", []), frame["event_time_ms"], 2 * window
    )
    state["lengths"] = _tail(state.get("lengths", []), frame["length"], window)
    state["episodes_total"] = state.get("episodes_total", 0) + int(frame["reward"].size)
    out["episodes_total"] = float(state["episodes_total"])
    out.update(stats.reward_window_features(state["rewards"], window))
    times = np.asarray(state["reward_times_ms"], dtype=np.int64)
    recent = np.asarray(state["rewards"])[times >= times.max() - config.reward_time_window_s * 1e3]
    out["reward_variance_time_window"] = stats.mean_variance(recent.tolist()).variance
    lengths = np.asarray(state["lengths"], dtype=np.float64)
    out["episode_length_mean"] = float(lengths.mean())
    out["episode_length_cv"] = stats.coefficient_of_variation(lengths)
    streak, last = state.get("same_end_streak", 0), state.get("last_end_reason")
    for reason in frame["termination_reason"]:
        streak = streak + 1 if (reason is not None and reason == last) else 1
        last = reason
    state["same_end_streak"], state["last_end_reason"] = streak, last
    out["episode_same_end_streak"] = float(streak if last is not None else 0)


def _steps(state: State, frame: Frame, config: FeatureConfig, out: dict[str, float]) -> None:
    window = config.grad_window_steps
    # A micro-step's sample (the loop accumulating gradients) carries its backward's norm
    # and is not a step of its own.
    micro = frame["grad_norm_source"] == MICRO_STEP
    state["steps_total"] = state.get("steps_total", 0) + int(frame["step"].size - micro.sum())
    out["steps_total"] = float(state["steps_total"])
    norms = frame["grad_norm"]
    has_norm = np.isfinite(norms)
    state["grad_steps"] = _tail(state.get("grad_steps", []), frame["step"][has_norm], window)
    state["grad_norms"] = _tail(state.get("grad_norms", []), norms[has_norm], window)
    state["grad_nonfinite"] = _tail(
        state.get("grad_nonfinite", []), frame["grad_nonfinite"].astype(np.int8), window
    )
    state["loss_nonfinite"] = _tail(
        state.get("loss_nonfinite", []), frame["loss_nonfinite"].astype(np.int8), window
    )
    out["grad_nonfinite_count"] = float(sum(state["grad_nonfinite"]))
    out["loss_nonfinite_count"] = float(sum(state["loss_nonfinite"]))
    if not state["grad_norms"]:
        return
    window_norms = np.asarray(state["grad_norms"])
    latest = float(window_norms[-1])
    out["grad_norm"] = latest
    out["grad_norm_jumps"] = float(stats.jump_count(
        window_norms[-(config.jump_window_steps + 1):], config.jump_ratio))
    out["grad_norm_spike_z"] = stats.spike_z(
        window_norms, int(has_norm.sum()), config.grad_window_steps, config.spike_min_window)
    slope = stats.log_slope(np.asarray(state["grad_steps"]), window_norms)
    if slope is not None:
        out["grad_norm_log_slope"] = slope


def _syncs(state: State, frame: Frame, config: FeatureConfig, out: dict[str, float]) -> None:
    window = config.sync_window
    for name, column in (("sync_latency_ms", frame["latency_ms"]), ("sync_bytes", frame["bytes"]),
                         ("sync_ok", frame["ok"].astype(np.int8)),
                         ("sync_times_ms", frame["event_time_ms"])):
        state[name] = _tail(state.get(name, []), column, window)
    latency = np.asarray(state["sync_latency_ms"], dtype=np.float64)
    p50, p95, p99 = stats.percentiles(latency, (50, 95, 99))
    out["grad_sync_latency_p50_ms"] = p50
    out["grad_sync_latency_p95_ms"] = p95
    out["grad_sync_latency_p99_ms"] = p99
    out["grad_sync_success_rate"] = float(np.mean(state["sync_ok"]))
    times = np.asarray(state["sync_times_ms"], dtype=np.int64)
    span_s = (times.max() - times.min()) / 1000.0
    if span_s > 0:
        # The first sync opens the window: its bytes fall before the span starts.
        out["grad_sync_bytes_per_s"] = float(np.sum(state["sync_bytes"][1:]) / span_s)
    out["grad_sync_bandwidth_jitter"] = stats.throughput_jitter(
        np.asarray(state["sync_bytes"], dtype=np.float64), latency
    )


def _gpus(state: State, frame: Frame, config: FeatureConfig, out: Update) -> None:
    lengths = state.get("lengths")
    regime = (
        stats.regime_of(float(np.mean(lengths)), config.regime_bounds_steps) if lengths
        else "short"
    )
    gpus = dict(state.get("gpus", {}))
    jitter = out.features.get("grad_sync_bandwidth_jitter", state.get("last_jitter", 0.0))
    state["last_jitter"] = jitter
    for uuid in dict.fromkeys(frame["gpu_uuid"].tolist()):
        rows = frame["gpu_uuid"] == uuid
        times, used = frame["event_time_ms"][rows], frame["memory_used_bytes"][rows]
        gpu = dict(gpus.get(uuid, {}))
        previous = gpu.get("last")  # [time_ms, used_bytes, regime]
        all_times = np.concatenate(([previous[0]], times)) if previous else times
        all_used = np.concatenate(([previous[1]], used)) if previous else used
        regimes = np.array(([previous[2]] if previous else []) + [regime] * times.size)
        totals = {k: list(v) for k, v in gpu.get("growth", {}).items()}
        for name, (delta_bytes, delta_s) in stats.growth_by_regime(
            all_times, all_used, regimes
        ).items():
            before = totals.get(name, [0.0, 0.0])
            totals[name] = [before[0] + delta_bytes, before[1] + delta_s]
        onsets, throttled = stats.throttle_onsets(
            frame["throttle_reasons"][rows], gpu.get("throttled", False)
        )
        gpu.update(
            model=str(frame["gpu_model"][rows][-1]),
            last=[int(times[-1]), int(used[-1]), regime],
            growth=totals,
            throttled=throttled,
            throttle_onsets=gpu.get("throttle_onsets", 0) + onsets,
            samples=gpu.get("samples", 0) + int(times.size),
            recent_times_ms=_tail(gpu.get("recent_times_ms", []), times, config.gpu_window),
            recent_used=_tail(gpu.get("recent_used", []), used, config.gpu_window),
        )
        gpus[uuid] = gpu
        out.gpus.append(GpuContribution(
            gpu_uuid=uuid, gpu_model=gpu["model"],
            regimes={k: (v[0], v[1]) for k, v in totals.items()},
            thermal_throttle_events=gpu["throttle_onsets"], bandwidth_jitter=float(jitter),
            samples=gpu["samples"],
        ))
        out.features["gpu_memory_used_bytes"] = float(used[-1])
        growth = stats.linear_slope(
            np.asarray(gpu["recent_times_ms"]) / 1000.0, np.asarray(gpu["recent_used"])
        )
        if growth is not None:
            out.features["gpu_memory_growth_bytes_per_s"] = growth
        out.features["gpu_thermal_throttle_events"] = float(gpu["throttle_onsets"])
        utilisation = frame["utilisation_pct"][rows]
        if np.isfinite(utilisation[-1]):
            out.features["gpu_utilisation_pct"] = float(utilisation[-1])
        temperature = frame["temperature_c"][rows]
        if np.isfinite(temperature[-1]):
            out.features["gpu_temperature_c"] = float(temperature[-1])
    state["gpus"] = gpus


def _heartbeats(state: State, frame: Frame, now_ms: int, out: dict[str, float]) -> None:
    state["last_heartbeat_ms"] = now_ms
    state["heartbeat_interval_s"] = float(frame["interval_s"][-1])
    out["probe_samples_dropped"] = float(frame["samples_dropped"][-1])
    out["heartbeat_age_s"] = 0.0
    state["lost"] = False
    out["worker_lost"] = 0.0


def liveness(
    state: State, now_ms: int, config: FeatureConfig, caught_up: bool = True
) -> tuple[State, dict[str, float] | None]:
    """The worker is lost once silent for ``lost_after_intervals`` heartbeat intervals:
    returns the new state and the features to publish when that happens (else None).
    The way back is the next heartbeat, handled by ``update``.

    ``caught_up``: whether every message already on the worker's partition has been
    processed. While some wait, silence is not the worker's (its heartbeats may be among
    them): a stream job that falls behind does not declare its workers lost."""
    last = state.get("last_heartbeat_ms")
    if last is None or state.get("lost") or not caught_up:
        return state, None
    age_s = (now_ms - last) / 1000.0
    if age_s <= config.lost_after_intervals * state.get("heartbeat_interval_s", 5.0):
        return state, None
    return {**state, "lost": True}, {"worker_lost": 1.0, "heartbeat_age_s": age_s}

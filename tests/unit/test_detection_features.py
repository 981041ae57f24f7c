"""The features detection rests on, on known inputs: chance of a run of rare endings, the
time-window variance, per-process and per-GPU memory, and a catalogue that says what the
code computes."""

from __future__ import annotations

import math
import random

import pytest

from dsec.schemas import MetricBatch, MetricColumns, WorkerIdentity
from dsec.schemas.features import WORKER_FEATURES
from dsec.schemas.frames import batch_frames
from dsec.schemas.metrics import CudaMemoryColumns, EpisodeColumns, GpuColumns
from dsec.stream_jobs import chance, worker_features
from dsec.stream_jobs.worker_features import FeatureConfig
from dsec.stream_jobs.worker_state import WorkerState

CONFIG = FeatureConfig()
IDENTITY = WorkerIdentity(job_id="job", worker_id="w1", node_id="n1")
GIB = 1 << 30


def _batch(second: int, **columns) -> MetricBatch:
    return MetricBatch(event_id=f"batch-{second:06d}", event_time_ms=1_000_000 + second * 1000,
                       identity=IDENTITY, columns=MetricColumns(**columns))


def _run(batches: list[MetricBatch]) -> tuple[WorkerState, list[worker_features.Update]]:
    state, updates = WorkerState(), []
    for offset, batch in enumerate(batches):
        update = worker_features.update(state, batch_frames(batch), 0, offset,
                                        batch.event_time_ms, CONFIG)
        state = update.state
        updates.append(update)
    return state, updates


def _episodes(reasons: list[str], rewards: list[float] | None = None,
              every_s: int = 20) -> list[MetricBatch]:
    rewards = rewards or [1.0] * len(reasons)
    return [_batch(i * every_s, episode=EpisodeColumns(
        event_time_ms=[1_000_000 + i * every_s * 1000], episode_index=[i], reward=[reward],
        length=[100], termination_reason=[reason]))
        for i, (reason, reward) in enumerate(zip(reasons, rewards, strict=True))]


def test_f_tail_matches_the_closed_form_and_scipy() -> None:
    # F(2, d): P(F >= x) = (1 + 2x/d)^(-d/2)
    for ratio in (0.5, 3.0, 16.5, 200.0):
        assert chance.f_tail(ratio, 2, 36) == pytest.approx((1 + ratio / 18) ** -18, rel=1e-9)
    stats = pytest.importorskip("scipy.stats")
    for d1, d2, ratio in ((1, 4, 2.0), (3, 9, 7.5), (19, 19, 4.0), (4, 36, 0.3)):
        assert chance.f_tail(ratio, d1, d2) == pytest.approx(stats.f.sf(ratio, d1, d2),
                                                             rel=1e-9)


def test_a_run_of_common_endings_is_nothing_and_a_rare_one_repeated_is_stuck() -> None:
    rng = random.Random(0)
    healthy = rng.choices(["time_limit", "truncated", "goal"], [0.7, 0.25, 0.05], k=60)
    _state, updates = _run(_episodes([*healthy, "time_limit", "time_limit", "time_limit"]))
    common = updates[-1].features
    assert common["episode_same_end_streak"] >= 3
    assert common["episode_end_streak_chance_per_h"] > 1.0  # many times an hour
    _state, updates = _run(_episodes([*healthy, *["collision_at_3_4"] * 5]))
    chances = [u.features["episode_end_streak_chance_per_h"] for u in updates[-5:]]
    assert chances == sorted(chances, reverse=True)  # each repeat makes it rarer
    # 60 endings before it, none of them this one: a share of 4.9 % at most (the 95 %
    # bound: 0.95 ** 60 = 0.05), three in a row, 180 episodes an hour
    assert chance.share_upper_bound(0, 60) == pytest.approx(1 - 0.05 ** (1 / 60))
    expected = (1 - 0.05 ** (1 / 60)) ** 3 * 180
    assert chances[2] == pytest.approx(expected, rel=1e-6)
    assert chances[4] < 1e-3  # the fifth in a row: under once in 1000 worker-hours


def test_no_chance_is_told_before_enough_endings() -> None:
    _state, updates = _run(_episodes(["a", "b", "c", "c"]))
    assert "episode_end_streak_chance_per_h" not in updates[-1].features


def test_a_variance_jump_is_seen_within_the_time_window_of_slow_episodes() -> None:
    rng = random.Random(1)
    calm = [rng.gauss(10.0, 1.0) for _ in range(30)]
    wild = [rng.gauss(10.0, 8.0) for _ in range(6)]
    _state, updates = _run(_episodes(["time_limit"] * 36, calm + wild, every_s=30))
    chances = [u.features.get("reward_volatility_chance_per_h") for u in updates]
    # Told once 10 episodes came before the window of 3 (one every 30 s); calm: often.
    assert chances[:12] == [None] * 12
    assert min(chances[12:30]) > 1.0
    # Four wild episodes in (two minutes), a jump that large would come by chance less
    # than once in 100 worker-hours; the 20-episode windows are not even full yet.
    after = updates[33].features
    assert after["reward_time_window_episodes"] == 3
    assert after["reward_volatility_chance_per_h"] < 0.01
    assert "reward_variance_jump_ratio" not in after


def _gpu(second: int, uuid: str, used: int, process: int | None, throttle: int = 0) -> GpuColumns:
    return GpuColumns(event_time_ms=[1_000_000 + second * 1000], gpu_uuid=[uuid],
                      memory_used_bytes=[used], memory_total_bytes=[80 * GIB],
                      process_memory_used_bytes=[process], throttle_reasons=[throttle],
                      temperature_c=[70.0])


def test_two_workers_on_one_card_see_the_card_and_their_own_memory() -> None:
    card = 13 * GIB  # 6.5 GiB each: over a 12 GiB per-worker ceiling card-wide
    _state, updates = _run([_batch(0, gpu=_gpu(0, "GPU-a", card, int(6.5 * GIB)))])
    features = updates[-1].features
    assert features["gpu_memory_used_bytes"] == card
    assert features["gpu_process_memory_bytes"] == 6.5 * GIB


def test_a_worker_without_nvml_gets_its_own_memory_from_cuda() -> None:
    cuda = CudaMemoryColumns(event_time_ms=[1_000_000], device_index=[0],
                             allocated_bytes=[12 * GIB], reserved_bytes=[13 * GIB])
    _state, updates = _run([_batch(0, cuda_memory=cuda)])
    features = updates[-1].features
    assert features["gpu_process_memory_bytes"] == 13 * GIB
    assert features["cuda_memory_allocated_bytes"] == 12 * GIB
    assert features["cuda_memory_fragmentation_ratio"] == pytest.approx(1 / 13)
    assert "gpu_memory_used_bytes" not in features


def test_one_worker_on_two_cards_keeps_a_feature_set_per_card() -> None:
    state, updates = _run([
        _batch(0, gpu=_gpu(0, "GPU-a", 20 * GIB, 5 * GIB)),
        _batch(1, gpu=_gpu(1, "GPU-b", 30 * GIB, 7 * GIB, throttle=0x20)),
    ])
    per_gpu = updates[-1].gpu_features
    assert per_gpu["GPU-b"]["gpu_memory_used_bytes"] == 30 * GIB
    assert per_gpu["GPU-b"]["gpu_thermal_throttled"] == 1.0
    features = updates[-1].features  # the worker's: over both, not the last one's alone
    assert features["gpu_memory_used_bytes"] == 30 * GIB
    assert features["gpu_process_memory_bytes"] == 12 * GIB
    assert features["gpu_thermal_throttled"] == 1.0
    assert set(state.gpus) == {"GPU-a", "GPU-b"}


def test_the_catalogue_says_what_the_code_computes() -> None:
    assert f"by {CONFIG.jump_ratio:g}x or more" in WORKER_FEATURES["grad_norm_jumps"]
    assert f"the last {CONFIG.jump_window_steps}" in WORKER_FEATURES["grad_norm_jumps"]
    assert "onsets" in WORKER_FEATURES["gpu_thermal_throttle_events"]
    assert f"last {CONFIG.gpu_window_samples} samples" in WORKER_FEATURES[
        "gpu_memory_growth_bytes_per_s"]
    assert f"last {CONFIG.end_history_episodes} endings" in WORKER_FEATURES[
        "episode_end_streak_chance_per_h"]
    window = WORKER_FEATURES["reward_time_window_episodes"]
    assert f"last {CONFIG.reward_time_window_s:g} s" in window
    assert f"at least {CONFIG.reward_time_window_min_episodes}" in window
    assert f"at most {CONFIG.reward_window_episodes}" in window
    assert f"up to {2 * CONFIG.reward_window_episodes} episodes" in WORKER_FEATURES[
        "reward_volatility_ratio"]
    assert not math.isnan(CONFIG.reward_time_window_s)

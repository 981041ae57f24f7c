"""Features never carry non-finite values: a huge finite input refuses its message and
leaves the worker's state as it was; a batch published twice is counted once."""

from __future__ import annotations

import numpy as np

from dsec.stream_jobs import finite, worker_features
from dsec.stream_jobs.worker_features import FeatureConfig, GpuContribution, Update
from dsec.stream_jobs.worker_state import WorkerState

CONFIG = FeatureConfig()


def _episodes(rewards: list[float], first_index: int = 0) -> dict:
    n = len(rewards)
    return {"episode": {
        "event_time_ms": np.arange(n, dtype=np.int64) + 1_000,
        "episode_index": np.arange(first_index, first_index + n, dtype=np.int64),
        "reward": np.array(rewards, dtype=np.float64),
        "length": np.full(n, 10, dtype=np.int64),
        "terminated": np.ones(n, dtype=np.bool_), "truncated": np.zeros(n, dtype=np.bool_),
        "termination_reason": np.full(n, None, dtype=object),
    }}


def test_nonfinite_outputs_names_features_and_gpu_fields() -> None:
    update = Update(state=WorkerState(),
                    features={"reward_variance": float("inf"), "reward_mean": 1.0},
                    gpus=[GpuContribution("GPU-1", "m", {"short": (float("nan"), 1.0)}, 0,
                                          float("inf"), 1)])
    assert finite.nonfinite_outputs(update) == [
        "gpu GPU-1 bandwidth_jitter", "gpu GPU-1 regimes.short", "reward_variance"]


def test_a_huge_reward_is_refused_and_the_state_stays_as_it_was() -> None:
    first, problem = finite.checked_update(WorkerState(), _episodes([1.0, 2.0]), 0, 0, 0, CONFIG)
    assert problem is None
    state = first.state
    refused, problem = finite.checked_update(state, _episodes([1e308, -1e308], 2), 0, 1, 0,
                                             CONFIG)
    assert problem is not None and "reward_variance" in problem
    assert refused.state is state and refused.skipped and not refused.features
    after, problem = finite.checked_update(state, _episodes([3.0], 2), 0, 2, 0, CONFIG)
    assert problem is None and after.features["episodes_total"] == 3.0
    assert all(np.isfinite(list(after.features.values())))


def test_a_batch_published_twice_is_counted_once() -> None:
    first = worker_features.update(WorkerState(), _episodes([1.0]), 0, 0, 0, CONFIG, "batch-a")
    again = worker_features.update(first.state, _episodes([1.0]), 0, 1, 0, CONFIG, "batch-a")
    assert again.skipped
    other = worker_features.update(first.state, _episodes([2.0], 1), 0, 1, 0, CONFIG,
                                   "batch-b")
    assert not other.skipped and other.features["episodes_total"] == 2.0

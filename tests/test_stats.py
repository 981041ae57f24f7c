from __future__ import annotations

import random
import statistics

import pytest

from dsec.stream_jobs.stats import (
    append_bounded,
    mean_variance,
    reward_window_features,
    variance_jump_ratio,
)


def test_welford_matches_the_textbook() -> None:
    values = [random.Random(1).gauss(100.0, 3.0) for _ in range(500)]
    result = mean_variance(values)
    assert result.count == 500
    assert result.mean == pytest.approx(statistics.fmean(values))
    assert result.variance == pytest.approx(statistics.variance(values))


def test_welford_is_stable_with_a_large_offset() -> None:
    values = [1e9 + x for x in (4.0, 7.0, 13.0, 16.0)]
    assert mean_variance(values).variance == pytest.approx(30.0)


def test_small_inputs() -> None:
    assert mean_variance([]).variance == 0.0
    assert mean_variance([5.0]) .mean == 5.0


def test_jump_ratio_has_a_floor() -> None:
    assert variance_jump_ratio(2.0, 8.0) == 4.0
    assert variance_jump_ratio(0.0, 1.0) == pytest.approx(1e9)


def test_window_features_find_a_jump() -> None:
    calm = [10.0, 10.5] * 10
    wild = [0.0, 40.0] * 10
    features = reward_window_features(calm + wild, window_episodes=20)
    assert features["reward_episodes"] == 20
    assert features["reward_variance_jump_ratio"] == pytest.approx(
        statistics.variance(wild) / statistics.variance(calm)
    )


def test_no_jump_before_two_windows() -> None:
    features = reward_window_features([1.0, 2.0, 3.0], window_episodes=20)
    assert "reward_variance_jump_ratio" not in features
    assert features["reward_episodes"] == 3


def test_append_bounded_keeps_the_newest() -> None:
    assert append_bounded([1.0, 2.0], [3.0, 4.0], 3) == [2.0, 3.0, 4.0]
    assert append_bounded([], [1.0], 3) == [1.0]

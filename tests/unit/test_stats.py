from __future__ import annotations

import random
import statistics

import numpy as np
import pytest

from dsec.stream_jobs import stats
from dsec.stream_jobs.stats import (
    append_bounded,
    coefficient_of_variation,
    growth_by_regime,
    linear_slope,
    log_slope,
    mean_std,
    mean_variance,
    percentiles,
    regime_of,
    reward_window_features,
    sorted_median,
    throttle_onsets,
    throughput_jitter,
    variance_jump_ratio,
    z_score,
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


def test_log_slope_recovers_an_exponential_decay() -> None:
    steps = np.arange(0, 200, dtype=np.float64)
    norms = 5.0 * np.exp(-0.01 * steps)
    assert log_slope(steps, norms) == pytest.approx(-0.01)
    norms[10] = np.nan
    norms[20] = 0.0  # unusable points are left out
    assert log_slope(steps, norms) == pytest.approx(-0.01)
    assert log_slope(steps[:2], norms[:2]) is None


def test_z_score_and_cv() -> None:
    window = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert z_score(3.0 + statistics.stdev(window), window) == pytest.approx(1.0)
    assert z_score(1.0, np.array([2.0, 2.0])) == 0.0
    assert coefficient_of_variation(np.array([10.0, 10.0])) == 0.0
    assert coefficient_of_variation(np.array([5.0, 15.0])) == pytest.approx(
        statistics.stdev([5.0, 15.0]) / 10.0)


def test_percentiles() -> None:
    values = np.arange(1, 101, dtype=np.float64)
    p50, p99 = percentiles(values, (50, 99))
    assert p50 == pytest.approx(50.5) and p99 == pytest.approx(99.01)
    assert percentiles(np.array([]), (50,)) == (0.0,)


def _windows() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    windows = [rng.normal(size=int(n)) * 10.0 ** int(e)
               for n, e in zip(rng.integers(1, 300, 300), rng.integers(-3, 7, 300), strict=True)]
    windows += [rng.integers(0, 9, size=int(n)).astype(np.float64)
                for n in rng.integers(1, 40, 100)]
    windows += [np.array([1.0, np.nan, 2.0]), np.array([np.inf, 1.0]),
                np.array([-np.inf, np.inf]), np.array([5, 1, 3], dtype=np.int64),
                np.full(4, 3.0), np.array([2.0])]
    return windows


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's own, on inf - inf
def test_percentiles_and_median_are_numpys_to_the_bit() -> None:
    qs = (0, 25.5, 50, 95, 99, 100)
    for window in _windows():
        expected = tuple(float(v) for v in np.percentile(window, qs))
        assert np.array_equal(percentiles(window, qs), expected, equal_nan=True), window
        assert np.array_equal(sorted_median(window), float(np.median(window)),
                              equal_nan=True), window


def test_growth_is_split_by_regime_and_skips_regime_changes() -> None:
    times_ms = np.arange(0, 10_000, 1000, dtype=np.int64)
    regimes = np.array(["long"] * 5 + ["short"] * 5)
    used = np.where(regimes == "long", 1_000 * np.arange(10), 4_000).astype(np.float64)
    growth = growth_by_regime(times_ms, used, regimes)
    assert growth["long"] == (4_000.0, 4.0)  # 1000 bytes/s on long episodes
    assert growth["short"] == (0.0, 4.0)  # stable on short ones; the switch pair is left out


def test_regime_of() -> None:
    assert regime_of(50, (100, 300)) == "short"
    assert regime_of(100, (100, 300)) == "medium"
    assert regime_of(300, (100, 300)) == "long"


def test_throttle_onsets_count_transitions() -> None:
    reasons = np.array([0, 0x40, 0x40, 0, 0x20, 0x4])  # 0x4 is not thermal
    assert throttle_onsets(reasons, previously_throttled=False) == (2, False)
    assert throttle_onsets(np.array([0x40]), previously_throttled=True) == (0, True)


def test_throughput_jitter_and_linear_slope() -> None:
    assert throughput_jitter(np.array([100.0, 100.0]), np.array([10.0, 10.0])) == 0.0
    assert throughput_jitter(np.array([100.0, 100.0]), np.array([10.0, 30.0])) > 0.5
    assert linear_slope(np.array([0.0, 1.0, 2.0]), np.array([5.0, 7.0, 9.0])) == 2.0
    assert linear_slope(np.array([1.0]), np.array([1.0])) is None


def test_robust_z_is_measured_from_the_median_in_mads() -> None:
    window = np.array([1.0, 2.0, 3.0, 4.0, 100.0])  # median 3, MAD 1
    assert stats.robust_z(3.0 + stats.MAD_TO_STD * 5, window) == pytest.approx(5.0)
    assert stats.robust_z(7.0, np.full(10, 2.0)) == 0.0  # flat window
    assert stats.robust_z(7.0, np.array([])) == 0.0


def test_spike_z_sees_every_new_value_and_is_not_hidden_by_earlier_spikes() -> None:
    rng = np.random.default_rng(0)
    calm = rng.lognormal(3.0, 0.8, 200)
    spiked = calm.copy()
    spiked[150] *= 50  # an earlier spike in the window
    batch = np.concatenate([spiked, [calm.max() * 50, calm[0]]])  # spike, then a calm step
    assert stats.spike_z(batch, 2, 200, 32) > 20
    assert stats.spike_z(batch, 1, 200, 32) < 3  # only the calm step is new
    assert stats.spike_z(calm[:20], 20, 200, 32) == 0.0  # too few values before any


def test_jump_count_counts_order_of_magnitude_swings_either_way() -> None:
    calm = np.array([30.0, 41.0, 25.0, 60.0, 33.0])  # drifts, no swing of 10x
    assert stats.jump_count(calm, 10.0) == 0
    swinging = np.array([30.0, 1500.0, 31.0, 29.0, 1450.0, 0.0, 28.0, np.nan, 2.0])
    # 30->1500, 1500->31, 29->1450, 1450->28 (0 and NaN left out), 28->2
    assert stats.jump_count(swinging, 10.0) == 5
    assert stats.jump_count(np.array([5.0]), 10.0) == 0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_mean_std_is_numpys_mean_and_sample_std_to_the_bit() -> None:
    for window in _windows():
        if window.size < 2:
            continue
        mean, std = mean_std(window)
        assert np.array_equal(mean, float(window.mean()), equal_nan=True), window
        assert np.array_equal(std, float(window.std(ddof=1)), equal_nan=True), window


def test_growth_on_a_few_samples_is_the_same_as_on_many(monkeypatch) -> None:
    # A probe message's one or two GPU samples take a Python path: the same bits as numpy's.
    rng = np.random.default_rng(5)
    for trial in range(500):
        count = int(rng.integers(2, 9))
        times = rng.integers(0, 10**6, size=count)
        if trial % 5 == 0:
            times[:] = times[0]  # ties keep their order
        used = rng.integers(0, 2**40, size=count)
        regimes = rng.choice(["short", "medium", "long"], size=count)
        small = growth_by_regime(times, used, regimes)
        monkeypatch.setattr(stats, "_SEQUENTIAL_SUM_MAX", 0)
        large = growth_by_regime(times, used, regimes)
        monkeypatch.undo()
        assert small == large and list(small) == list(large)

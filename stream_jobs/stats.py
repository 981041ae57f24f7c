"""Training-health statistics: pure functions over windows of samples, no state of their own."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from dsec.schemas.units import ms_to_s


@dataclass(frozen=True)
class MeanVariance:
    count: int
    mean: float
    variance: float  # sample variance (n - 1); 0.0 below two values


def mean_variance(values: Sequence[float]) -> MeanVariance:
    """Welford's one-pass algorithm: stable where the naive sum of squares is not."""
    count, mean, m2 = 0, 0.0, 0.0
    for value in values:
        count += 1
        delta = value - mean
        mean += delta / count
        m2 += delta * (value - mean)
    variance = m2 / (count - 1) if count > 1 else 0.0
    return MeanVariance(count, mean, variance)


def variance_jump_ratio(previous: float, current: float, floor: float = 1e-9) -> float:
    """How much the variance grew from one window to the next; the floor keeps it finite."""
    return current / max(previous, floor)


def reward_window_features(rewards: Sequence[float], window_episodes: int) -> dict[str, float]:
    """Features of the last ``window_episodes`` rewards, and the jump against the window before.

    ``rewards`` is oldest first and holds up to two windows.
    """
    if window_episodes < 2:
        raise ValueError("window_episodes must be at least 2")
    current = mean_variance(rewards[-window_episodes:])
    features = {
        "reward_mean": current.mean,
        "reward_variance": current.variance,
        "reward_episodes": float(current.count),
    }
    previous_values = rewards[-2 * window_episodes : -window_episodes]
    if len(previous_values) == window_episodes and current.count == window_episodes:
        previous = mean_variance(previous_values)
        ratio = variance_jump_ratio(previous.variance, current.variance)
        if math.isfinite(ratio):
            features["reward_variance_jump_ratio"] = min(ratio, 1e12)
    return features


def append_bounded(values: list[float], new: Sequence[float], capacity: int) -> list[float]:
    """``values`` followed by ``new``, keeping the newest ``capacity`` entries."""
    combined = [*values, *new]
    return combined[-capacity:] if len(combined) > capacity else combined


def coefficient_of_variation(values: np.ndarray) -> float:
    """Standard deviation over mean (0 for an empty or zero-mean window)."""
    if values.size < 2:
        return 0.0
    mean, std = mean_std(values)
    return std / mean if mean else 0.0


def mean_std(values: np.ndarray) -> tuple[float, float]:
    """``values.mean()`` and ``values.std(ddof=1)`` in one pass over the sum, by numpy's own
    steps (the same bits): the pair costs half of the two calls. At least two values."""
    data = values.astype(np.float64, copy=False)
    mean = np.add.reduce(data) / data.size
    deviations = data - mean
    variance = np.add.reduce(deviations * deviations) / (data.size - 1)
    return float(mean), math.sqrt(variance) if variance >= 0 else math.nan


def log_slope(steps: np.ndarray, norms: np.ndarray) -> float | None:
    """Least-squares slope of log(norm) against step: the gradient norm's decay rate per step.

    Non-finite and non-positive norms are left out; None below three usable points.
    """
    usable = np.isfinite(norms) & (norms > 0)
    if not usable.all():
        steps, norms = steps[usable], norms[usable]
    if norms.size < 3:
        return None
    x = steps.astype(np.float64)
    x_centered = x - np.add.reduce(x) / x.size
    spread = float(x_centered @ x_centered)
    if spread == 0:
        return None
    y = np.log(norms)
    return float(x_centered @ (y - np.add.reduce(y) / y.size) / spread)


def z_score(value: float, window: np.ndarray) -> float:
    """How many standard deviations ``value`` lies from the window's mean (0 if flat)."""
    if window.size < 2:
        return 0.0
    mean, std = mean_std(window)
    return (value - mean) / std if std > 0 else 0.0


# 1.4826 x the median absolute deviation estimates a normal distribution's standard deviation.
MAD_TO_STD = 1.4826


def robust_z(value: float, window: np.ndarray) -> float:
    """How many robust standard deviations (``MAD_TO_STD`` x the median absolute deviation)
    ``value`` lies from the window's median (0 if the window is empty or flat). Unlike the
    mean and standard deviation, neither moves much for a few outliers in the window: a
    burst of spikes does not hide the spikes after its first."""
    if window.size == 0:
        return 0.0
    median = sorted_median(window)
    spread = MAD_TO_STD * sorted_median(np.abs(window - median))
    return (value - median) / spread if spread > 0 else 0.0


def spike_z(values: np.ndarray, new_count: int, window: int, min_window: int) -> float:
    """The robust z-score of the largest of the last ``new_count`` of ``values`` against the
    (up to ``window``) values before them; 0 with fewer than ``min_window`` before. Every
    new value counts, not only the latest: a spike followed by a calm step in the same
    batch is still a spike. One median and one MAD a batch, whatever its size."""
    first_new = max(values.size - new_count, 0)
    before = values[max(0, first_new - window):first_new]
    new = values[first_new:]
    new = new[np.isfinite(new)]
    if before.size < min_window or new.size == 0:
        return 0.0
    return robust_z(float(new.max()), before)


def jump_count(values: np.ndarray, ratio: float) -> int:
    """How many consecutive pairs of ``values`` differ by ``ratio`` or more, up or down.

    Gradient norms that swing by an order of magnitude from one step to the next, again and
    again, are numerical trouble building (the loss blowing up on some steps and not on
    others); a healthy run's norms drift, shift level and spike now and then, but rarely
    swing like that more than once per update. Non-positive and non-finite values are left
    out."""
    usable = values[np.isfinite(values) & (values > 0)]
    if usable.size < 2:
        return 0
    logs = np.log(usable)
    return int(np.count_nonzero(np.abs(logs[1:] - logs[:-1]) >= math.log(ratio)))


def sorted_median(values: np.ndarray) -> float:
    """``np.median`` (NaN where any value is NaN) by one sort: a tenth of its cost on the
    windows of a few hundred values the features take it of, once a message."""
    count = values.size
    if count == 0:
        return math.nan
    ordered = np.sort(values, kind="stable")  # NaN sorts last
    top = float(ordered[-1])
    if math.isnan(top):
        return math.nan
    half = count // 2
    if count % 2:
        return float(ordered[half])
    return (float(ordered[half - 1]) + float(ordered[half])) / 2


def percentiles(values: np.ndarray, qs: tuple[float, ...]) -> tuple[float, ...]:
    """Exact percentiles of a bounded window (the window is the sketch): ``np.percentile``'s
    linear interpolation by one sort and its own interpolation formula, at a tenth of its
    cost on small windows. 0.0 for an empty window, NaN where a value is NaN."""
    count = values.size
    if count == 0:
        return tuple(0.0 for _ in qs)
    ordered = np.sort(values, kind="stable").tolist()  # NaN sorts last
    if math.isnan(ordered[-1]):
        return tuple(math.nan for _ in qs)
    out = []
    for q in qs:
        position = q / 100 * (count - 1)
        below = min(math.floor(position), count - 1)
        fraction = position - below
        low, high = ordered[below], ordered[min(below + 1, count - 1)]
        step = high - low
        # numpy's lerp: from the nearer end, so that the result stays within [low, high]
        out.append(float(high - step * (1 - fraction) if fraction >= 0.5
                         else low + step * fraction))
    return tuple(out)


def growth_by_regime(
    times_ms: np.ndarray, used_bytes: np.ndarray, regimes: np.ndarray
) -> dict[str, tuple[float, float]]:
    """Memory growth split by episode-length regime: for each regime, the summed byte change
    and summed seconds over consecutive sample pairs that both fall in that regime.

    Returns ``{regime: (delta_bytes, delta_s)}``; the rate is their quotient. Pairs that
    straddle a regime change are left out, so a leak on long episodes is not smeared over
    short ones.
    """
    out: dict[str, tuple[float, float]] = {}
    if times_ms.size < 2:
        return out
    if times_ms.size <= _SEQUENTIAL_SUM_MAX:
        return _growth_by_regime_small(times_ms.tolist(), used_bytes.tolist(),
                                       regimes.tolist())
    order = np.argsort(times_ms, kind="stable")
    t, b, r = times_ms[order], used_bytes[order].astype(np.float64), regimes[order]
    same = r[1:] == r[:-1]
    dt_s = ms_to_s(t[1:] - t[:-1])
    db = b[1:] - b[:-1]
    for regime in sorted(set(r[1:][same].tolist())):
        mask = same & (r[1:] == regime)
        out[str(regime)] = (float(db[mask].sum()), float(dt_s[mask].sum()))
    return out


# numpy sums fewer than eight values one after the other, as Python's ``sum`` does: up to
# this many samples a regime's sums come out the same bits either way.
_SEQUENTIAL_SUM_MAX = 8


def _growth_by_regime_small(times_ms: list, used_bytes: list,
                            regimes: list) -> dict[str, tuple[float, float]]:
    """``growth_by_regime`` on a few samples (a GPU's one or two of a probe message) in
    Python, where numpy's per-call cost was most of the work."""
    order = sorted(range(len(times_ms)), key=times_ms.__getitem__)  # stable, as argsort
    deltas: dict[str, tuple[list[float], list[float]]] = {}
    for before, after in pairwise(order):
        if regimes[after] != regimes[before]:
            continue
        bytes_list, seconds_list = deltas.setdefault(str(regimes[after]), ([], []))
        bytes_list.append(float(used_bytes[after]) - float(used_bytes[before]))
        seconds_list.append(ms_to_s(times_ms[after] - times_ms[before]))
    return {regime: (float(sum(deltas[regime][0])), float(sum(deltas[regime][1])))
            for regime in sorted(deltas)}


def regime_of(episode_length: float, bounds_steps: tuple[float, float]) -> str:
    short_below, long_from = bounds_steps
    if episode_length < short_below:
        return "short"
    return "long" if episode_length >= long_from else "medium"


THERMAL_THROTTLE_MASK = 0x20 | 0x40  # NVML: software and hardware thermal slowdown


def throttle_onsets(reasons: np.ndarray, previously_throttled: bool) -> tuple[int, bool]:
    """Count transitions into thermal throttling; returns (onsets, throttled now)."""
    if reasons.size == 0:
        return 0, previously_throttled
    throttled = (reasons.astype(np.int64) & THERMAL_THROTTLE_MASK) != 0
    before = np.concatenate(([previously_throttled], throttled[:-1]))
    return int((throttled & ~before).sum()), bool(throttled[-1])


def throughput_jitter(bytes_: np.ndarray, latency_ms: np.ndarray) -> float:
    """Coefficient of variation of per-sync throughput (bytes/s): the link's jitter."""
    usable = latency_ms > 0
    if usable.sum() < 2:
        return 0.0
    return coefficient_of_variation(bytes_[usable] / ms_to_s(latency_ms[usable]))


def linear_slope(x: np.ndarray, y: np.ndarray) -> float | None:
    """Least-squares slope of y against x; None below two distinct x values."""
    if x.size < 2:
        return None
    xf = x.astype(np.float64)
    x_centered = xf - xf.mean()
    denominator = float((x_centered * x_centered).sum())
    if denominator == 0:
        return None
    return float((x_centered * (y.astype(np.float64) - y.mean())).sum() / denominator)

"""Reward statistics over a rolling window of episodes: pure functions, no state of their own."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


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

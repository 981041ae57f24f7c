"""Reward variance over a time window against the worker's returns before it.

Episode windows (20 against the 20 before) see a jump only after 20 episodes, which at
tens of seconds an episode is many minutes. The time window takes the episodes of the
last ``reward_time_window_s`` (at least ``min_episodes``, at most one episode window)
and compares their sample variance with that of the returns kept before them. The
comparison is an F test; its tail probability, times the worker's rate of episodes, is
how often per hour a jump that large would come by chance: few episodes need a large
jump, many a smaller one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dsec.schemas.units import duration_ms
from dsec.stream_jobs import chance, stats

__all__ = ["volatility_features"]

# Variance floor: returns that are all alike before (a constant reward) would make any
# spread an infinite jump.
_VARIANCE_FLOOR = 1e-12


def volatility_features(
    rewards: Sequence[float], times_ms: Sequence[int], window_s: float, min_episodes: int,
    max_episodes: int, min_before: int, rate_per_hour: float | None,
) -> dict[str, float]:
    """``reward_time_window_episodes`` always; ``reward_volatility_ratio`` and
    ``reward_volatility_chance_per_h`` once ``min_before`` returns came before the window."""
    times = np.asarray(times_ms, dtype=np.int64)
    in_window = int((times >= times[-1] - duration_ms(window_s)).sum()) if times.size else 0
    size = min(max(in_window, min_episodes), max_episodes, len(rewards))
    out = {"reward_time_window_episodes": float(size)}
    before = rewards[:len(rewards) - size]
    if size < min_episodes or len(before) < min_before:
        return out
    current = stats.mean_variance(rewards[-size:]).variance
    baseline = max(stats.mean_variance(before).variance, _VARIANCE_FLOOR)
    ratio = min(current / baseline, 1e12)
    out["reward_volatility_ratio"] = ratio
    if rate_per_hour is not None:
        tail = chance.f_tail(ratio, size - 1, len(before) - 1)
        out["reward_volatility_chance_per_h"] = chance.per_hour(tail, rate_per_hour)
    return out

"""Stuck episodes: an ending that is rare for this worker, repeated.

A run of one ending says little by itself: where most healthy episodes end by time limit
or truncation, three in a row come all the time. What marks a worker stuck (three
collisions at the same place) is an ending it seldom has, again and again. So each run is
judged against the worker's own endings before the run began, as the chance of such a
run per hour at the worker's rate of episodes, at the largest share of that ending its
history allows (``chance.streak_probability``): little history, or an ending merely not
seen yet, needs a longer run.
"""

from __future__ import annotations

from collections.abc import Sequence

from dsec.stream_jobs import chance

__all__ = ["EPISODES_PER_HOUR_MIN_SPAN_MS", "end_features", "episodes_per_hour", "next_streak"]

# The span a rate of episodes is told over is at least this long, so that a burst of
# episodes (all in one message) still gives a rate, and a finite one.
EPISODES_PER_HOUR_MIN_SPAN_MS = 1_000


def next_streak(streak: int, last: str | None,
                reasons: Sequence[str | None]) -> tuple[int, str | None]:
    """The run of same endings after ``reasons`` (oldest first); an ending without a reason
    starts no run."""
    for reason in reasons:
        streak = streak + 1 if (reason is not None and reason == last) else 1
        last = reason
    return streak, last


def episodes_per_hour(times_ms: Sequence[int]) -> float | None:
    """The worker's rate of episodes over the ones given (their end times, oldest first)."""
    if len(times_ms) < 2:
        return None
    span_ms = max(times_ms[-1] - times_ms[0], EPISODES_PER_HOUR_MIN_SPAN_MS)
    return (len(times_ms) - 1) * 3_600_000.0 / span_ms


def end_features(history: Sequence[str], streak: int, last: str | None,
                 rate_per_hour: float | None, min_history_episodes: int) -> dict[str, float]:
    """``episode_end_streak_chance_per_h`` for the run that ends ``history`` (the worker's
    recent endings, oldest first, the run included): none where the run has no reason,
    fewer than ``min_history_episodes`` endings came before it, or the rate is not known."""
    before = history[:max(len(history) - streak, 0)]
    if last is None or rate_per_hour is None or len(before) < min_history_episodes:
        return {}
    probability = chance.streak_probability(before.count(last), len(before), streak)
    return {"episode_end_streak_chance_per_h": chance.per_hour(probability, rate_per_hour)}

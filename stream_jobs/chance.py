"""How often something would come by chance: tail probabilities, pure functions.

Thresholds on these read as false-positive rates: a policy that fires when a worker's
run of rare endings, or its jump in reward variance, would come by chance less than once
in a thousand worker-hours is chosen for that rate, whatever the workload's episode
length. No scipy at run time: the F distribution's tail is the regularized incomplete
beta function, by its continued fraction (Numerical Recipes, 6.4).
"""

from __future__ import annotations

import math

__all__ = [
    "f_tail", "incomplete_beta", "per_hour", "share_upper_bound", "streak_probability",
]

_EPSILON = 3e-16
_TINY = 1e-300
_MAX_TERMS = 300


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS + 1):
        m2 = 2 * m
        for numerator in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                          -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPSILON:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def f_tail(ratio: float, dof_num: int, dof_den: int) -> float:
    """P(F >= ratio) for an F(dof_num, dof_den) variable: the chance that a variance
    estimated from dof_num degrees of freedom is ``ratio`` times one from dof_den, or more,
    when both estimate the same variance."""
    if ratio <= 0.0:
        return 1.0
    if not math.isfinite(ratio):
        return 0.0
    return incomplete_beta(dof_den / 2.0, dof_num / 2.0, dof_den / (dof_den + dof_num * ratio))


def share_upper_bound(count: int, seen: int, confidence: float = 0.95) -> float:
    """The largest share of a kind of event still likely given ``count`` of them in
    ``seen`` (the one-sided Clopper-Pearson bound: below it, so few would have come with
    probability under 1 - ``confidence``). Never 0, and large while ``seen`` is small."""
    if count >= seen:
        return 1.0
    low, high = count / seen, 1.0
    for _ in range(60):
        share = (low + high) / 2.0
        # P(at most ``count`` in ``seen``) at this share
        at_most = incomplete_beta(seen - count, count + 1, 1.0 - share)
        if at_most > 1.0 - confidence:
            low = share
        else:
            high = share
    return high


def streak_probability(count_before: int, seen_before: int, streak: int) -> float:
    """The chance of ``streak`` endings in a row of a kind the worker had ``count_before``
    times in its ``seen_before`` endings before the streak, at the largest share of that
    kind its history allows (``share_upper_bound``): a worker with little history, or one
    whose ending was merely not seen yet, is not taken for stuck."""
    return share_upper_bound(count_before, seen_before) ** streak


def per_hour(probability: float, events_per_hour: float) -> float:
    """How often per hour an event of that probability comes, evaluated at that rate: an
    upper bound where successive evaluations overlap (the union of them)."""
    return probability * events_per_hour

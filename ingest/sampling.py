"""How often the probe pays for a gradient norm: pure functions, tested on their own.

A norm read on the training thread right after ``backward`` meets cold caches: on a small
CPU step it costs 150-400 us, a tenth of a 3 ms step. On a GPU it is a kernel launch of a
few tens of microseconds against steps of tens of milliseconds. A fixed interval is
either too costly on the first or needlessly sparse on the second, so by default the
probe spaces its norms to keep their cost within a budget share of the step time.
"""

from __future__ import annotations

import math


def norm_interval_steps(
    norm_cost_s: float, step_time_s: float, budget_fraction: float, max_interval_steps: int
) -> int:
    """The fewest steps between two norms that keep their cost within ``budget_fraction``
    of the training time: a norm costing ``norm_cost_s`` every N steps of ``step_time_s``
    costs ``norm_cost_s / (N * step_time_s)``. Between 1 and ``max_interval_steps``."""
    if not (norm_cost_s > 0 and step_time_s > 0 and budget_fraction > 0):
        return 1
    wanted = math.ceil(norm_cost_s / (budget_fraction * step_time_s))
    return max(1, min(max_interval_steps, wanted))


def smoothed(previous: float | None, value: float, weight: float = 0.2) -> float:
    """An exponentially weighted mean; the first value stands for itself."""
    return value if previous is None else previous + weight * (value - previous)

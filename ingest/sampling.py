"""How often the probe pays for a step sample or a gradient norm: pure functions and the
small state that follows them, tested on their own.

Python run on the training thread right after ``backward`` or an optimizer step meets cold
caches: on a small CPU step a gradient norm costs 80-400 us and a step sample 20-60 us, a
few percent of a 2 ms step. On a GPU the same work is tens of microseconds against steps
of tens of milliseconds. A fixed interval is either too costly on the first or needlessly
sparse on the second, so by default the probe spaces both to keep their cost within a
budget share of the step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def budget_interval_steps(
    cost_s: float, step_time_s: float, budget_fraction: float, max_interval_steps: int
) -> int:
    """The fewest steps between two runs of a piece of work that keep its cost within
    ``budget_fraction`` of the training time: work costing ``cost_s`` every N steps of
    ``step_time_s`` costs ``cost_s / (N * step_time_s)``. Between 1 and
    ``max_interval_steps``."""
    if not (cost_s > 0 and step_time_s > 0 and budget_fraction > 0):
        return 1
    wanted = math.ceil(cost_s / (budget_fraction * step_time_s))
    return max(1, min(max_interval_steps, wanted))


def smoothed(previous: float | None, value: float, weight: float = 0.2) -> float:
    """An exponentially weighted mean; the first value stands for itself."""
    return value if previous is None else previous + weight * (value - previous)


@dataclass
class SpacedWork:
    """How often one piece of training-thread work runs: every ``fixed_interval_steps``
    when set, else spaced by its measured cost (10 steps until the cost is known). The
    first timing is left out: it pays for torch's first call of the kernels."""

    budget_fraction: float
    max_interval_steps: int
    fixed_interval_steps: int | None = None
    interval_steps: int = field(init=False)
    cost_s: float | None = None  # smoothed
    timed: int = 0

    def __post_init__(self) -> None:
        self.interval_steps = self.fixed_interval_steps or 10

    def took(self, cost_s: float, step_time_s: float | None) -> None:
        """One run took ``cost_s``; steps take ``step_time_s`` (None: not known yet)."""
        self.timed += 1
        if self.timed == 1:
            return
        self.cost_s = smoothed(self.cost_s, cost_s)
        if self.fixed_interval_steps is None and step_time_s:
            self.interval_steps = budget_interval_steps(
                self.cost_s, step_time_s, self.budget_fraction, self.max_interval_steps)

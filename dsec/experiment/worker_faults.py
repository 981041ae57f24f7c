"""The faults of one experiment worker's schedule, as they strike its training loop.

Times are seconds since the run's start, read from an injected clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from dsec.experiment.faults import FaultEvent
from dsec.schemas.units import ms_to_s

HEALTHY_LINK_BYTES_PER_S = 2e9
SIM_GRAD_PARAMS = 2_500_000  # what the simulated model's gradient sync puts on the wire


def wire_bytes(bits: int) -> int:
    """Bytes of one simulated gradient sync at ``bits`` per value."""
    return SIM_GRAD_PARAMS * (4 if bits >= 32 else 2 if bits == 16 else 1) if bits >= 8 \
        else SIM_GRAD_PARAMS * bits // 8


class ScheduledFaults:
    def __init__(self, schedule: list[FaultEvent], params: Mapping[str, Any],
                 run_time_s: Callable[[], float], rng: np.random.Generator) -> None:
        self.schedule = schedule
        self._params = params
        self._run_time_s = run_time_s
        self._rng = rng
        self._used_stalls: set[float] = set()
        self._nan_left: dict[float, int] = {}

    def active(self, kind: str) -> list[FaultEvent]:
        t_s = self._run_time_s()
        return [e for e in self.schedule if e.kind == kind and e.active(t_s)]

    def crash_due(self) -> bool:
        t_s = self._run_time_s()
        return any(e.kind == "crash" and e.start_s <= t_s for e in self.schedule)

    def hang_due(self) -> bool:
        t_s = self._run_time_s()
        return any(e.kind == "silent_hang" and e.start_s <= t_s for e in self.schedule)

    def slowdown(self) -> float:
        """How many times slower the card runs now (stragglers)."""
        factors = [self._params["straggler"]["slowdown"] for _ in self.active("straggler")]
        return max(factors, default=1.0)

    def card_failure_due(self, born_s: float) -> bool:
        """Whether the flaky card under this worker fails now: ``fail_after_s`` after the
        later of the fault's start and this worker's start."""
        t_s = self._run_time_s()
        fail_after_s = self._params.get("flaky_card", {}).get("fail_after_s", 0.0)
        return any(t_s >= max(e.start_s, born_s) + fail_after_s
                   for e in self.active("flaky_card"))

    def param(self, kind: str, name: str) -> Any:
        return self._params[kind][name]

    def link_s(self, bits: int) -> float:
        """How long this step's gradient sync takes on the worker's simulated link: jitter
        while a jitter fault is on, and each stall once."""
        seconds = wire_bytes(bits) / HEALTHY_LINK_BYTES_PER_S
        if self.active("sync_jitter"):
            jitter = self._params["sync_jitter"]
            seconds = wire_bytes(bits) / jitter["degraded_bytes_per_s"]
            seconds += ms_to_s(abs(np.random.normal(0.0, jitter["jitter_ms"])))
        for stall in self.active("sync_stall"):
            if stall.start_s not in self._used_stalls:
                self._used_stalls.add(stall.start_s)
                seconds += stall.end_s - stall.start_s
        return seconds

    def loss_factor(self) -> float:
        """The factor on this step's loss: gradient-norm spikes before a NaN burst, then
        NaN for the burst's steps."""
        t_s = self._run_time_s()
        burst = self._params.get("nan_burst", {})
        for event in self.schedule:
            if event.kind != "nan_burst":
                continue
            if event.start_s <= t_s < event.end_s:
                return burst["spike_factor"] if self._rng.random() < 0.5 else 1.0
            if t_s >= event.end_s:
                left = self._nan_left.setdefault(event.start_s, burst["burst_steps"])
                if left > 0:
                    self._nan_left[event.start_s] = left - 1
                    return math.nan
        return 1.0

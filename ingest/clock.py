"""The probe's clocks as one seam: the system's by default, a manual one that tests move."""

from __future__ import annotations

import time
from typing import Protocol

from dsec.schemas import now_ms
from dsec.schemas.units import duration_ms


class Clock(Protocol):
    def monotonic_s(self) -> float:
        """Seconds that never go back: costs, step times, intervals and deadlines."""

    def now_ms(self) -> int:
        """Epoch milliseconds: event times."""


class SystemClock:
    """The system's clocks. The methods are the C functions themselves rather than methods
    that call them, so a part that keeps ``clock.monotonic_s`` pays what
    ``time.perf_counter()`` costs, on the training thread too."""

    monotonic_s = staticmethod(time.perf_counter)
    now_ms = staticmethod(now_ms)


class ManualClock:
    """A clock that moves only when told to: both readings move together."""

    def __init__(self, start_s: float = 1000.0, start_ms: int = 1_700_000_000_000) -> None:
        self._now_s = start_s
        self._offset_ms = start_ms - round(duration_ms(start_s))

    def monotonic_s(self) -> float:
        return self._now_s

    def now_ms(self) -> int:
        return self._offset_ms + round(duration_ms(self._now_s))

    def advance(self, by_s: float) -> None:
        if by_s < 0:
            raise ValueError(f"a clock does not go back ({by_s} s)")
        self._now_s += by_s

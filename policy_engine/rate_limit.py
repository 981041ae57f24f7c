"""A cap on the commands each worker receives per minute of event time."""

from __future__ import annotations

from collections.abc import Sequence

WINDOW_MS = 60_000


def admit(sent_ms: Sequence[int], now_ms: int, cap: int,
          window_ms: int = WINDOW_MS) -> tuple[bool, list[int]]:
    """Whether one more command at ``now_ms`` stays within ``cap`` per ``window_ms``, and
    the send times to keep: those still inside the window, plus ``now_ms`` when admitted.
    Never more than ``cap`` times are kept."""
    recent = [t for t in sent_ms if t > now_ms - window_ms]
    if len(recent) >= cap:
        return False, recent
    return True, [*recent, now_ms]


class CommandBudget:
    """Per worker, the event times of the commands sent in the last window."""

    def __init__(self, per_min: int, window_ms: int = WINDOW_MS) -> None:
        self.per_min = per_min
        self.window_ms = window_ms
        self._sent: dict[str, list[int]] = {}

    def admit(self, worker: str, now_ms: int) -> bool:
        allowed, kept = admit(self._sent.get(worker, ()), now_ms, self.per_min, self.window_ms)
        self._sent[worker] = kept
        return allowed

    def forget_before(self, now_ms: int) -> None:
        """Drop the workers that have had no command within the window before ``now_ms``."""
        horizon = now_ms - self.window_ms
        self._sent = {w: times for w, times in self._sent.items()
                      if times and max(times) > horizon}

"""A cap on the commands each worker receives per minute of event time."""

from __future__ import annotations

from collections.abc import Sequence

WINDOW_MS = 60_000
# A worker with no command for this long behind the newest event the engine has seen is
# forgotten. Far longer than the window: event clocks of workers in one batch differ (a
# replayed backlog beside live events), and each worker's window is judged on its own
# events, so only a worker idle this long loses its count.
IDLE_MS = 3_600_000


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

    def __init__(self, per_min: int, window_ms: int = WINDOW_MS,
                 idle_ms: int = IDLE_MS) -> None:
        self.per_min = per_min
        self.window_ms = window_ms
        self.idle_ms = max(idle_ms, window_ms)
        self._sent: dict[str, list[int]] = {}
        self._swept_ms: int | None = None

    def admit(self, worker: str, now_ms: int) -> bool:
        allowed, kept = admit(self._sent.get(worker, ()), now_ms, self.per_min, self.window_ms)
        self._sent[worker] = kept
        return allowed

    def forget_idle(self, newest_ms: int) -> None:
        """Drop the workers whose last command is over ``idle_ms`` older than ``newest_ms``
        (the newest event time seen, of any worker). The sweep runs once per window of
        event time: a worker is forgotten up to a window late, never early."""
        if self._swept_ms is not None and newest_ms - self._swept_ms < self.window_ms:
            return
        self._swept_ms = newest_ms
        horizon = newest_ms - self.idle_ms
        self._sent = {w: times for w, times in self._sent.items()
                      if times and max(times) > horizon}

"""Source partitions whose commits stand still with messages behind them: since when,
for the stream workers' log and health check. No Faust here: the Faust app feeds it."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CommitStalls"]


@dataclass
class CommitStalls:
    """Partitions (``(topic, partition)``) whose committed offset stands still while
    messages wait behind it and it is not paused for table recovery: since when, for the
    log and the health check."""

    log_every_s: float = 30.0
    _since: dict[tuple[str, int], tuple[int | None, float]] = field(default_factory=dict)
    _logged_s: dict[tuple[str, int], float] = field(default_factory=dict)

    def observe(self, tp: tuple[str, int], committed: int | None, end: int, paused: bool,
                now_s: float) -> float | None:
        """How long ``tp``'s commits have stood still, when it is time to log it (once
        every ``log_every_s`` of standing); else None."""
        last = self._since.get(tp)
        if last is None or last[0] != committed or end <= (committed or 0) or paused:
            self._since[tp] = (committed, now_s)
            self._logged_s.pop(tp, None)
            return None
        stood_s = now_s - last[1]
        if now_s - self._logged_s.get(tp, last[1]) < self.log_every_s:
            return None
        self._logged_s[tp] = now_s
        return stood_s

    def keep_only(self, assigned: set[tuple[str, int]]) -> None:
        """Forgets the partitions this worker no longer holds."""
        for tp in set(self._since) - assigned:
            del self._since[tp]
            self._logged_s.pop(tp, None)

    def longest(self, now_s: float) -> tuple[tuple[str, int], float] | None:
        """The partition standing still the longest and for how long (None: none held)."""
        if not self._since:
            return None
        tp, (_committed, since_s) = min(self._since.items(), key=lambda item: item[1][1])
        return tp, now_s - since_s

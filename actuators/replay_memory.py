"""The actuation ids a gate has let through, each kept until its command has expired.

Bounded by count, and only an expired id is ever forgotten: a memory full of ids
still in force refuses a new one rather than forget one that could be replayed.
"""

from __future__ import annotations

import heapq


class ReplayMemory:
    def __init__(self, capacity: int, keep_after_expiry_ms: int = 0) -> None:
        """``keep_after_expiry_ms``: how long past its expiry an id is still kept (the
        clock-skew bound, so a clock stepped back does not make a replay fresh again)."""
        if capacity < 1 or keep_after_expiry_ms < 0:
            raise ValueError("a replay memory needs capacity >= 1 and keep_after_expiry_ms >= 0")
        self.capacity = capacity
        self._keep_after_expiry_ms = keep_after_expiry_ms
        self._expiry_ms: dict[str, int] = {}
        self._by_expiry: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return len(self._expiry_ms)

    def __contains__(self, actuation_id: object) -> bool:
        return actuation_id in self._expiry_ms

    def remember(self, actuation_id: str, expires_at_ms: int, now_ms: int) -> bool:
        """Keeps ``actuation_id`` until ``expires_at_ms``; False (nothing kept) when the
        memory is full of ids that have not expired yet."""
        if actuation_id in self._expiry_ms:
            return True
        if len(self._expiry_ms) >= self.capacity:
            self.forget_expired(now_ms)
            if len(self._expiry_ms) >= self.capacity:
                return False
        self._expiry_ms[actuation_id] = expires_at_ms
        heapq.heappush(self._by_expiry, (expires_at_ms, actuation_id))
        return True

    def forget_expired(self, now_ms: int) -> int:
        """Forgets the ids expired (plus the kept margin) by ``now_ms``; how many."""
        forgotten = 0
        horizon_ms = now_ms - self._keep_after_expiry_ms
        while self._by_expiry and self._by_expiry[0][0] <= horizon_ms:
            _expires_at_ms, actuation_id = heapq.heappop(self._by_expiry)
            del self._expiry_ms[actuation_id]
            forgotten += 1
        return forgotten

"""The ids the sink stored lately, so that a replayed event or batch is not stored twice.

An id is claimed when a batch holding it is prepared, and kept once that batch is durable.
A batch whose write fails gives its claims back: its messages, read again (one at a time,
or by the loop that replaces this one), are stored rather than skipped as duplicates.
Batches are prepared on the loop's thread while the one before is written on another, so
every method takes the lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

Claim = tuple[str, str]  # (scope: a table, or "raw" for metric batches; id)


class RecentIds:
    """Per scope, at most ``capacity`` kept ids, oldest forgotten first, and the claims of
    batches not yet durable."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._kept: dict[str, OrderedDict[str, None]] = {}
        self._claimed: set[Claim] = set()
        self._lock = threading.Lock()

    def claim(self, scope: str, event_id: str) -> bool:
        """True, and the id is claimed, unless it is kept or claimed already."""
        claim = (scope, event_id)
        with self._lock:
            if claim in self._claimed or event_id in self._kept.get(scope, ()):
                return False
            self._claimed.add(claim)
            return True

    def keep(self, claims: Iterable[Claim]) -> None:
        """The claims' batch is durable."""
        with self._lock:
            for claim in claims:
                self._claimed.discard(claim)
                self._add(*claim)

    def release(self, claims: Iterable[Claim]) -> None:
        """The claims' batch was not stored."""
        with self._lock:
            self._claimed.difference_update(claims)

    def release_all(self) -> None:
        """A new loop starts: no batch before it is in flight any more."""
        with self._lock:
            self._claimed.clear()

    def seed(self, scope: str, event_ids: Iterable[str]) -> None:
        """Ids stored before this process started, oldest first."""
        with self._lock:
            for event_id in event_ids:
                self._add(scope, event_id)

    def _add(self, scope: str, event_id: str) -> None:
        kept = self._kept.setdefault(scope, OrderedDict())
        kept[event_id] = None
        if len(kept) > self.capacity:
            kept.popitem(last=False)

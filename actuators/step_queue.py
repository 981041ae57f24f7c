"""What a reader thread hands the training thread, taken at its next step boundary."""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")


class StepBoundaryQueue(Generic[Item]):
    def __init__(self, on_put: Callable[[], None] = lambda: None) -> None:
        """``on_put`` is called on the reader's thread after each item: the probe's
        ``wake``, so that the next step boundary takes it."""
        self._items: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._on_put = on_put

    def put(self, item: Item) -> None:
        self._items.put(item)
        self._on_put()

    def drain(self, handle: Callable[[Item], object]) -> int:
        """Hands every queued item to ``handle`` on this thread; how many."""
        handled = 0
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                return handled
            handle(item)
            handled += 1

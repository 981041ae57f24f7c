"""Gradient-sync priority: a level the loop's communication scheduling reads."""

from __future__ import annotations

from dsec.schemas.actuations import SyncPriorityParams


class SyncPriority:
    def __init__(self) -> None:
        self.level = 0

    def apply(self, params: SyncPriorityParams) -> str:
        previous, self.level = self.level, params.level
        return f"sync priority {previous} -> {self.level}"

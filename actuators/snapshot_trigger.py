"""Snapshot trigger: starts a state snapshot at the step boundary the command arrives on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsec.actuators.effects import Effect
from dsec.actuators.snapshotter import Snapshotter
from dsec.schemas.actuations import SnapshotParams


class SnapshotTrigger:
    def __init__(self, global_step: Callable[[], int]) -> None:
        self._global_step = global_step
        self.snapshotter: Snapshotter | None = None
        self.extra_state: Callable[[], dict[str, Any]] | None = None

    def attach(
        self, snapshotter: Snapshotter, extra_state: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        self.snapshotter = snapshotter
        self.extra_state = extra_state

    def apply(self, params: SnapshotParams) -> str | Effect:
        """Starts the snapshot at the command's compression level (the snapshotter's own
        where it gives none)."""
        if self.snapshotter is None:
            return Effect.unsupported("snapshot", "no snapshotter",
                                      "call dsec.enable_snapshots(model, optimizer)")
        step = self._global_step()
        extra = self.extra_state() if self.extra_state is not None else {}
        seq = self.snapshotter.request(step, extra, compression_level=params.compression_level)
        if seq is None:
            return f"snapshot already in flight at step {step}; coalesced"
        return f"snapshot {seq} started at step {step}"

"""The strong arm's asynchronous checkpoint: the training thread stages a copy of the state
at a step boundary (as DCP ``async_save`` stages to host memory) and a background thread
writes it, so training does not wait for the disk."""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


class AsyncCheckpointer:
    def __init__(self, path: Path, interval_s: float,
                 on_written: Callable[[int], None] | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.path = path
        self.interval_s = interval_s
        self._clock = clock or time.time
        self._last_staged_s = self._clock()
        self._on_written = on_written
        self._thread: threading.Thread | None = None

    def due(self) -> bool:
        return self._clock() - self._last_staged_s >= self.interval_s

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             updates: int) -> bool:
        """Stages the state and starts writing it; False (nothing staged) while the
        previous write is still going, as ``async_save`` makes the caller wait or skip."""
        if self._thread is not None and self._thread.is_alive():
            return False
        state = {"model": copy.deepcopy(model.state_dict()),
                 "optimizer": copy.deepcopy(optimizer.state_dict()), "updates": updates}
        self._last_staged_s = self._clock()
        self._thread = threading.Thread(target=self._write, args=(state,), daemon=True,
                                        name="async-checkpoint")
        self._thread.start()
        return True

    def _write(self, state: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        torch.save(state, tmp)
        with tmp.open("rb") as handle:
            os.fsync(handle.fileno())
        tmp.replace(self.path)  # a reader sees the old checkpoint or the new, never half
        if self._on_written is not None:
            self._on_written(int(state["updates"]))

    def wait(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The latest complete checkpoint at ``path``, or None."""
    if not path.exists():
        return None
    return torch.load(path, weights_only=False)

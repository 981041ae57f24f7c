"""Gradient accumulation: sync and step every N micro-steps; DDP skips the all-reduce between."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from dsec.schemas.actuations import GradAccumulationParams


class GradAccumulation:
    """Loop usage::

        with accumulation.micro_step(ddp_model) as sync:
            accumulation.scale(loss).backward()
        if sync:
            optimizer.step(); optimizer.zero_grad()

    A new step count is adopted at the next accumulation boundary, so no window mixes two.
    ``on_window`` hears the window at each micro-step (the probe then takes the norm of
    every micro-step while it is above 1).
    """

    def __init__(self, steps: int = 1, on_window: Callable[[int], None] | None = None) -> None:
        self.steps = steps
        self._on_window = on_window
        self._pending: int | None = None
        self._position = 0  # micro-steps done in the current window

    @property
    def sync_now(self) -> bool:
        """Whether the micro-step about to run ends the window (all-reduce and step)."""
        return self._position + 1 >= self.steps

    def scale(self, loss: Any) -> Any:
        return loss / self.steps if self.steps > 1 else loss

    def micro_step(self, ddp_model: Any = None) -> AbstractContextManager[bool]:
        return _MicroStep(self, ddp_model)

    def _advance(self) -> None:
        self._position += 1
        if self._position >= self.steps:
            self._position = 0
            if self._pending is not None:
                self.steps, self._pending = self._pending, None

    def apply(self, params: GradAccumulationParams) -> str:
        if self._position == 0:
            previous, self.steps = self.steps, params.steps
            return f"accumulation {previous} -> {self.steps} steps"
        self._pending = params.steps
        return f"accumulation -> {params.steps} steps from the next window"


class _MicroStep:
    def __init__(self, owner: GradAccumulation, ddp_model: Any) -> None:
        self._owner = owner
        self._sync = owner.sync_now
        no_sync = getattr(ddp_model, "no_sync", None)
        self._inner: AbstractContextManager[Any] = (
            nullcontext() if self._sync or no_sync is None else no_sync()
        )

    def __enter__(self) -> bool:
        if self._owner._on_window is not None:
            self._owner._on_window(self._owner.steps)
        self._inner.__enter__()
        return self._sync

    def __exit__(self, *exc: object) -> None:
        self._inner.__exit__(*exc)  # type: ignore[arg-type]
        if exc[0] is None:
            self._owner._advance()

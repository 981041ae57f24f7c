"""Gradient accumulation: sync and step every N micro-steps; DDP skips the all-reduce between."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from dsec.actuators.effects import Effect, Pending
from dsec.actuators.loop_setting import LoopSetting
from dsec.schemas.actuations import GradAccumulationParams


class GradAccumulation(LoopSetting[int]):
    """Loop usage::

        with accumulation.micro_step(ddp_model) as sync:
            accumulation.scale(loss).backward()
        if sync:
            optimizer.step(); optimizer.zero_grad()

    A new step count is adopted at the next accumulation boundary, so no window mixes two;
    the window in force is the one the loop last started. A loop that keeps its own count
    (a data-parallel group agreeing on one) says at each window's start which it runs,
    with ``run_window``. ``on_window`` hears the window at each micro-step (the probe then
    takes the norm of every micro-step while it is above 1).
    """

    what = "gradient accumulation steps"
    unattached = "the training loop does not accumulate through the GradAccumulation helper"
    attach_hint = ("run each micro-step in `with dsec.controls().grad_accumulation"
                   ".micro_step(model) as sync:` and step the optimizer when sync")

    def __init__(self, steps: int = 1, on_window: Callable[[int], None] | None = None) -> None:
        super().__init__(steps)
        self.steps = steps  # the window the current (or next) micro-steps belong to
        self._on_window = on_window
        self._position = 0  # micro-steps done in the current window

    @property
    def sync_now(self) -> bool:
        """Whether the micro-step about to run ends the window (all-reduce and step)."""
        return self._position + 1 >= self.steps

    def scale(self, loss: Any) -> Any:
        return loss / self.steps if self.steps > 1 else loss

    def micro_step(self, ddp_model: Any = None) -> AbstractContextManager[bool]:
        if self._position == 0:
            self.steps = self.take(self.requested)
        return _MicroStep(self, ddp_model)

    def run_window(self, steps: int) -> int:
        """The loop starts a window of ``steps`` micro-steps that it counts itself."""
        self.steps = self.take(steps)
        if self._on_window is not None:
            self._on_window(steps)
        return steps

    def _advance(self) -> None:
        self._position += 1
        if self._position >= self.steps:
            self._position = 0

    def apply(self, params: GradAccumulationParams) -> Effect | Pending:
        outcome = self.request(params.steps)
        if self._position == 0:
            self.steps = self.requested
        return outcome

    def applied_detail(self, previous: int, target: int) -> str:
        return super().applied_detail(previous, target) + " (from a window boundary)"


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

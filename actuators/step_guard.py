"""The non-finite step guard: an optimizer step whose gradients hold a NaN or an Inf is
skipped, so that it never reaches the weights.

A NaN that comes without a precursor is in the weights one step after it appears, long
before a command could come back from the policy engine. Loss scaling (``GradScaler``)
already skips such a step in fp16; this guard does the same at every precision. Before
each step it checks the optimizer's gradients (one fused norm, one read to the host) and,
when they are not finite, hides them from the step: torch's optimizers leave a parameter
without a gradient untouched, weights and moments alike. The gradients are given back
after the step, as they were, so the loop and the probe see what they would have seen.
The precision downgrade the NaN sets off comes after it, from the policy engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def grads_finite(optimizer: Any) -> bool:
    """Whether every gradient the optimizer holds is finite (True when it holds none):
    a NaN or an Inf anywhere in a gradient makes its norm non-finite."""
    import torch

    grads = [p.grad for group in optimizer.param_groups for p in group["params"]
             if p.grad is not None]
    if not grads:
        return True
    with torch.no_grad():
        norms = torch._foreach_norm(grads)
        device = norms[0].device
        return bool(torch.isfinite(torch.stack([n.to(device) for n in norms])).all())


class NonFiniteStepGuard:
    """Hooks one optimizer, or every optimizer of the process when ``optimizer`` is None
    (torch's global step hooks, as ``dsec run`` uses); ``skipped_steps`` counts the steps
    it kept off the weights."""

    def __init__(self, optimizer: Any = None,
                 on_skip: Callable[[int], None] | None = None) -> None:
        self._on_skip = on_skip
        self._hidden: list[tuple[Any, Any]] = []  # (parameter, its gradient) during a skip
        self.steps = 0
        self.skipped_steps = 0
        self.unchecked_steps = 0
        if optimizer is None:
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            self._handles = [register_optimizer_step_pre_hook(self._before_step),
                             register_optimizer_step_post_hook(self._after_step)]
        else:
            self._handles = [optimizer.register_step_pre_hook(self._before_step),
                             optimizer.register_step_post_hook(self._after_step)]

    def _before_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        self.steps += 1
        try:
            if grads_finite(optimizer):
                return
        except Exception:  # gradients it cannot take a norm of: the step goes ahead
            self.unchecked_steps += 1
            return
        self._hidden = [(p, p.grad) for group in optimizer.param_groups
                        for p in group["params"] if p.grad is not None]
        for p, _ in self._hidden:
            p.grad = None
        self.skipped_steps += 1
        if self._on_skip is not None:
            self._on_skip(self.skipped_steps)

    def _after_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        for p, grad in self._hidden:
            p.grad = grad
        self._hidden = []

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

"""Gradient norms per micro-step, for loops that accumulate gradients over several backwards.

With accumulation an optimizer step sums the gradients of several micro-steps, so its norm
averages theirs: a loss that blows up on some micro-steps and not on others (numerical
trouble building) shows in the step norms only as a raised level, which a healthy run's
norms also show. Each micro-step's own norm keeps the swings visible.

A hook on every parameter takes the norm of the gradient that backward hands it (before it
is added to ``.grad``), and a callback at the end of the backward combines them: one norm
per micro-step, without copying any gradient. It costs a norm per parameter tensor and
backward, so it runs only while the loop says it accumulates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

NormSink = Callable[[Any], None]  # receives each micro-step's norm, a 0-d tensor


class MicroStepNorms:
    """Per-parameter gradient hooks that report one L2 norm per backward pass."""

    def __init__(self, sink: NormSink) -> None:
        self._sink = sink
        self._handles: list[Any] = []
        self._parts: list[Any] = []

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self, parameters: Iterable[Any]) -> None:
        """Hooks every parameter that takes gradients (again: hooks already there go first)."""
        self.detach()
        self._handles = [p.register_hook(self._on_grad) for p in parameters if p.requires_grad]

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._parts = []

    def _on_grad(self, grad: Any) -> None:
        import torch

        try:
            if not self._parts:  # the backward's first gradient: combine them when it ends
                torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._parts.append(torch.linalg.vector_norm(grad.detach()))
        except Exception:  # a sparse or unusual gradient: no norm, and the backward goes on
            log.exception("dsec: micro-step gradient norm not taken")

    def _finish(self) -> None:
        import torch

        parts, self._parts = self._parts, []
        if not parts:
            return
        try:
            try:
                norm = torch.linalg.vector_norm(torch.stack(parts))
            except RuntimeError:  # gradients on several devices meet on the first one's
                device = parts[0].device
                norm = torch.linalg.vector_norm(torch.stack([p.to(device) for p in parts]))
            self._sink(norm)
        except Exception:  # telemetry never fails a backward
            log.exception("dsec: micro-step gradient norm not recorded")

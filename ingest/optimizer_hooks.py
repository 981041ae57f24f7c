"""The probe's hold on the optimizers: one post-step hook that counts every step and, on a
step due for it, takes the gradient norm; and the per-micro-step norms while the loop
accumulates gradients."""

from __future__ import annotations

from typing import Any

from dsec.ingest.callbacks import WarnOnce
from dsec.ingest.clock import Clock
from dsec.ingest.micro_steps import MicroStepNorms
from dsec.ingest.step_sampler import StepSampler
from dsec.ingest.values import host_value


def total_grad_norm(optimizer: Any) -> Any:
    """L2 norm of every gradient the optimizer holds, as a tensor (no device sync), or None.

    One fused ``_foreach_norm``; gradients on several devices meet on the first one's.
    """
    import torch

    grads = [
        p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None
    ]
    if not grads:
        return None
    with torch.no_grad():
        norms = torch._foreach_norm(grads)
        try:  # one device, the common case: no per-norm ``.to`` on the training thread
            return torch.linalg.vector_norm(torch.stack(norms))
        except RuntimeError:
            device = norms[0].device
            return torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]))


class OptimizerHooks:
    def __init__(self, sampler: StepSampler, clock: Clock) -> None:
        self._sampler = sampler
        self._monotonic_s = clock.monotonic_s
        self._handles: list[Any] = []
        self._watched: list[Any] = []
        self._micro = MicroStepNorms(sampler.record_micro_step_norm)
        self._warn_once = WarnOnce()
        self.watching = False  # an attribute: ``dsec.report_step`` reads it every step

        def after_step(optimizer: Any, _args: Any, _kwargs: Any) -> None:
            step = sampler.global_step  # the fast path, inline: no call on most steps
            sampler.global_step = step + 1
            if step < sampler.fast_until_step:
                return
            self._step_boundary(optimizer, step)

        self._after_step = after_step

    def watch(self, optimizer: Any) -> None:
        """Hooks an optimizer: after each step, the step is counted; on a step due for it,
        the gradient L2 norm is taken and a sample recorded.

        One post-step hook does it all (a second hook would cost every step a call). The
        norm is taken after the step: the optimizers read the gradients without changing
        them, and they are still in the cache then.
        """
        self._handles.append(optimizer.register_step_post_hook(self._after_step))
        self._watched.append(optimizer)
        self.watching = True
        self._sampler.restart_step_time()

    def step_hook(self) -> Any:
        """The post-step hook, for a caller that runs it after every optimizer's step itself
        (``dsec run`` through torch's global step hook): ``hook(optimizer, args, kwargs)``
        counts and samples each step as for a watched optimizer. The caller stops calling
        it at ``unwatch``."""
        self.watching = True
        self._sampler.restart_step_time()
        return self._after_step

    def unwatch(self) -> None:
        """Removes the optimizer hooks and the micro-step hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._watched.clear()
        self.watching = False
        self._micro.detach()
        self._sampler.norms_per_micro_step = False

    def observe_micro_steps(self, micro_steps: int, parameters: Any = None) -> None:
        """The loop runs ``micro_steps`` backwards per optimizer step (gradient accumulation).

        Above 1, every micro-step's gradient norm is a sample of its own
        (``grad_norm_source="micro_step"``) instead of the accumulated step's, so that a
        loss blowing up on some micro-steps and not on others still shows as swings rather
        than as a raised average. At 1 it goes back to step norms. The parameters are those
        of the watched optimizers unless given. Cheap to call every step: only a change
        does anything.
        """
        if (micro_steps > 1) == self._micro.attached:
            return
        if micro_steps <= 1:
            self._micro.detach()
        else:
            if parameters is None:
                parameters = [p for optimizer in self._watched
                              for group in optimizer.param_groups for p in group["params"]]
            self._micro.attach(parameters)
        self._sampler.norms_per_micro_step = self._micro.attached

    def _step_boundary(self, optimizer: Any, step: int) -> None:
        """A watched step off the fast path: its norm when due, then the sampler's turn."""
        entered_s = self._monotonic_s()
        if self._sampler.norm_due(step):
            self._take_norm(optimizer)
            entered_s = self._monotonic_s()  # the norm is charged to the norms
        try:
            self._sampler.step_boundary(step, None, None, entered_s)
        except Exception:  # telemetry never crashes the training loop
            self._warn_once("record_step", "dsec: step not recorded")

    def _take_norm(self, optimizer: Any) -> None:
        try:
            started_s = self._monotonic_s()
            grad_norm = host_value(total_grad_norm(optimizer))
            self._sampler.took_norm(grad_norm, self._monotonic_s() - started_s)
        except Exception:  # sparse or unusual gradients: no norm, and training goes on
            self._warn_once("grad_norm", "dsec: gradient norm not computed")

"""The probe's post-step hook on its own: it counts every step inline and leaves the rest
to the sampler only on steps off the fast path."""

from __future__ import annotations

import torch

from dsec.ingest.clock import ManualClock
from dsec.ingest.config import ProbeConfig
from dsec.ingest.optimizer_hooks import OptimizerHooks
from dsec.ingest.step_sampler import StepSampler


def _hooked(**config: object) -> tuple[OptimizerHooks, StepSampler, list, torch.nn.Module,
                                       torch.optim.Optimizer]:
    samples: list[tuple] = []
    sampler = StepSampler(ProbeConfig(**config), samples.append, ManualClock(),
                          lambda: None, lambda: None)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hooks = OptimizerHooks(sampler, ManualClock())
    hooks.watch(optimizer)
    return hooks, sampler, samples, model, optimizer


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()


def test_the_hook_counts_every_step_and_takes_norms_when_due() -> None:
    hooks, sampler, samples, model, optimizer = _hooked(step_sample_every_n_steps=3,
                                                        grad_norm_every_n_steps=3)
    assert hooks.watching
    for _ in range(7):
        _step(model, optimizer)
    assert sampler.global_step == 7
    assert [(s[2], s[6]) for s in samples] == [(0, "probe"), (3, "probe"), (6, "probe")]
    hooks.unwatch()
    _step(model, optimizer)
    assert not hooks.watching and sampler.global_step == 7


def test_micro_step_norms_replace_the_step_norm_until_back_to_one() -> None:
    hooks, sampler, samples, model, optimizer = _hooked(step_sample_every_n_steps=1,
                                                        grad_norm_every_n_steps=1)
    hooks.observe_micro_steps(2)
    assert sampler.norms_per_micro_step
    _step(model, optimizer)
    assert [s[6] for s in samples] == ["micro_step", None]
    hooks.observe_micro_steps(1)
    assert not sampler.norms_per_micro_step
    _step(model, optimizer)
    assert samples[-1][6] == "probe"

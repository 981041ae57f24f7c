"""Gradient compression and accumulation on a real DDP model over a one-rank gloo group
(several ranks: tests/integration/test_gloo_ranks.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dsec.actuators.grad_accumulation import GradAccumulation
from dsec.actuators.grad_compression import GradCompression
from dsec.actuators.quantised_all_reduce import QuantisedAllReduce
from dsec.schemas.actuations import GradAccumulationParams, GradCompressionParams


@pytest.fixture
def gloo_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}",
                            rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _grads(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    model(x).pow(2).mean().backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def test_compression_bits_change_the_gradient_ddp_averages(gloo_group) -> None:
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(64, 64))
    compression = GradCompression()
    compression.attach(model)
    x = torch.randn(8, 64)
    exact = _grads(model, x)
    compression.apply(GradCompressionParams(bits=8))
    eight = _grads(model, x)
    compression.apply(GradCompressionParams(bits=4))
    four = _grads(model, x)
    assert compression.last_bits == 4
    assert compression.wire_bytes == 0  # a group of one sends nothing, at any bits
    error_8 = (eight - exact).abs().max().item()
    error_4 = (four - exact).abs().max().item()
    assert 0 < error_8 < error_4 <= exact.abs().max().item() / 7


def test_accumulation_skips_the_all_reduce_between_windows(gloo_group) -> None:
    model = DistributedDataParallel(torch.nn.Linear(16, 4))
    compression = GradCompression()
    compression.attach(model)
    accumulation = GradAccumulation()
    accumulation.apply(GradAccumulationParams(steps=4))
    syncs = []
    for _ in range(8):
        with accumulation.micro_step(model) as sync:
            accumulation.scale(model(torch.randn(2, 16)).sum()).backward()
        syncs.append(sync)
    assert syncs.count(True) == 2
    assert compression.buckets_sent == 2  # the comm hook ran only at window ends


def test_error_feedback_keeps_the_running_sum_within_a_step(gloo_group) -> None:
    """The same gradient every step at 4 bits: with error feedback the sum of the averages
    stays within a step of the exact sum; without it the rounding piles up."""
    torch.manual_seed(0)
    gradient = torch.randn(3000) * torch.linspace(0.01, 1.0, 3000)
    step = gradient.abs().max().item() / 7
    sums = {}
    for error_feedback in (True, False):
        reducer = QuantisedAllReduce(error_feedback)
        total = torch.zeros_like(gradient)
        for _ in range(40):
            future, _ = reducer.average(gradient.clone(), 4)
            total += future.wait()
        sums[error_feedback] = (total - 40 * gradient).abs().max().item()
    assert sums[True] <= step
    assert sums[True] * 10 < sums[False]


def test_a_gradient_that_overflowed_reaches_the_average_and_is_not_carried(gloo_group) -> None:
    """An fp16 overflow must show in the average (a GradScaler skips the step on it), and
    its residual must not poison the steps after it."""
    reducer = QuantisedAllReduce(error_feedback=True)
    gradient = torch.randn(1000)
    overflowed = gradient.clone()
    overflowed[10] = float("inf")
    future, _ = reducer.average(overflowed, 8)
    assert not bool(torch.isfinite(future.wait()).all())
    future, _ = reducer.average(gradient.clone(), 8)
    after = future.wait()
    step = gradient.abs().max().item() / 127
    assert bool(torch.isfinite(after).all())
    assert (after - gradient).abs().max().item() <= step + 1e-6

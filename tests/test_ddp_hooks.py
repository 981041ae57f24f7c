"""Gradient compression and accumulation on a real DDP model over a gloo process group."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dsec.actuators.grad_accumulation import GradAccumulation
from dsec.actuators.grad_compression import GradCompression
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


def test_compression_bits_change_what_ddp_puts_on_the_wire(gloo_group) -> None:
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(64, 64))
    compression = GradCompression()
    compression.attach(model)
    x = torch.randn(8, 64)
    exact = _grads(model, x)
    wire_fp32 = compression.wire_bytes
    compression.apply(GradCompressionParams(bits=8))
    eight = _grads(model, x)
    wire_8 = compression.wire_bytes - wire_fp32
    compression.apply(GradCompressionParams(bits=4))
    four = _grads(model, x)
    wire_4 = compression.wire_bytes - wire_fp32 - wire_8
    assert compression.last_bits == 4
    assert wire_4 < wire_8 < wire_fp32
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

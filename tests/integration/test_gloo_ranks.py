"""dsec's gradient hooks across real gloo groups of several processes: the quantised
all-reduce and the sync-priority weighting give every rank the same, defined average."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dsec.actuators.grad_compression import GradCompression
from dsec.schemas.actuations import GradCompressionParams


def _two_rank_worker(rank: int, store_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=2)
    try:
        wire_bytes = {}
        for bits in (32, 16, 8, 4):
            torch.manual_seed(0)  # the same weights on both ranks, as DDP requires
            model = DistributedDataParallel(torch.nn.Linear(32, 16))
            compression = GradCompression()
            compression.apply(GradCompressionParams(bits=bits))
            compression.attach(model)
            torch.manual_seed(100 + rank)  # different data per rank
            x = torch.randn(8, 32)
            model(x).pow(2).mean().backward()
            got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            wire_bytes[bits] = compression.wire_bytes
            if bits >= 16:
                continue
            reference = torch.nn.Linear(32, 16)
            reference.load_state_dict(model.module.state_dict())
            reference(x).pow(2).mean().backward()
            local = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
            gathered = [torch.empty_like(local) for _ in range(2)]
            dist.all_gather(gathered, local)
            exact_mean = (gathered[0] + gathered[1]) / 2
            step = max(g.abs().max().item() for g in gathered) / (127 if bits == 8 else 7)
            # half a step from each rank's codes, half from the re-quantised average
            assert (got - exact_mean).abs().max().item() <= step + 1e-6, bits
            results = [torch.empty_like(got) for _ in range(2)]
            dist.all_gather(results, got)
            assert torch.equal(results[0], results[1]), bits  # every rank, the same average
            assert compression.wire_bytes < local.numel() * 4 / (3 if bits == 8 else 6)
        assert wire_bytes[4] < wire_bytes[8] < wire_bytes[16] < wire_bytes[32]
        # Both ranks done before either tears down: gloo aborts a rank whose peer left
        # mid-exchange.
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # gloo's threads can abort the interpreter's own exit ("terminate called without an
    # active exception"); the checks are done, so leave without it.
    os._exit(0)


def test_quantised_all_reduce_averages_two_ranks(tmp_path) -> None:
    """8 and 4 bits over a real two-rank gloo group: every rank ends with the same mean of
    both ranks' gradients, within a quantisation step; fewer bits, fewer bytes sent."""
    import torch.multiprocessing as mp

    mp.spawn(_two_rank_worker, args=(str(tmp_path / "store"),), nprocs=2, join=True)


def _weighted_rank_worker(rank: int, store_path: str, levels: list[int]) -> None:
    """One rank of a three-rank DDP group whose hook is the controls' (compression weighed
    by sync priority); its level arrives as a command, applied at a step boundary."""
    from dsec.actuators import ApplyHooks
    from dsec.actuators.worker_controls import WorkerControls
    from dsec.schemas import ActuationStatus
    from dsec.schemas.actuations import SyncPriorityParams

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=len(levels))
    try:
        torch.manual_seed(0)  # the same weights on every rank, as DDP requires
        model = DistributedDataParallel(torch.nn.Linear(16, 8))
        controls, hooks = WorkerControls(), ApplyHooks()
        controls.register(hooks)
        model.register_comm_hook(None, controls.comm_hook())

        def local_gradient(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
            """(what DDP averaged, this rank's own gradient) for this rank's batch."""
            torch.manual_seed(seed + rank)
            x = torch.randn(4, 16)
            model.zero_grad()
            model(x).pow(2).mean().backward()
            got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            reference = torch.nn.Linear(16, 8)
            reference.load_state_dict(model.module.state_dict())
            reference(x).pow(2).mean().backward()
            return got, torch.cat([p.grad.reshape(-1) for p in reference.parameters()])

        def gathered(local: torch.Tensor) -> list[torch.Tensor]:
            parts = [torch.empty_like(local) for _ in levels]
            dist.all_gather(parts, local)
            return parts

        got, local = local_gradient(100)
        plain = gathered(local)
        assert torch.allclose(got, sum(plain) / len(levels), atol=1e-6)  # level 0: the mean

        assert hooks.apply(SyncPriorityParams(level=levels[rank]), f"cmd-{rank}") is None
        assert hooks.settle() == []  # no bucket has used the new level yet: not applied
        got, local = local_gradient(200)
        parts = gathered(local)
        weights = [2.0 ** level for level in levels]
        weighted = sum(w * g for w, g in zip(weights, parts, strict=True)) / sum(weights)
        mean = sum(parts) / len(levels)
        assert torch.allclose(got, weighted, atol=1e-6)
        assert not torch.allclose(got, mean, atol=1e-4)  # the outcome changed as defined
        [settled] = hooks.settle()
        assert settled.effect.status is ActuationStatus.APPLIED
        assert settled.effect.in_force == str(levels[rank])  # the level the hook used
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


def test_sync_priority_weighs_a_ranks_gradient_in_a_real_gloo_group(tmp_path) -> None:
    """Three ranks; rank 2 is dropped to level -2 (weight 1/4), rank 1 raised to 1
    (weight 2): every rank ends with sum(w_i g_i) / sum(w_i), and each result says
    applied only after its hook weighed a bucket with the new level."""
    import torch.multiprocessing as mp

    mp.spawn(_weighted_rank_worker, args=(str(tmp_path / "store"), [0, 1, -2]), nprocs=3,
             join=True)

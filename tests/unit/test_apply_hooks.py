"""Each apply hook on its own: the worker's state actually changes."""

from __future__ import annotations

import threading

import pytest
import torch

from dsec.actuators import ApplyHooks
from dsec.actuators.grad_accumulation import GradAccumulation
from dsec.actuators.grad_compression import (
    GradCompression,
    dequantise_gradient,
    quantise_gradient,
)
from dsec.actuators.memory_cap import MemoryCap
from dsec.actuators.precision import AutocastController
from dsec.actuators.sampler import SamplerGate
from dsec.actuators.snapshot_trigger import SnapshotNotConfiguredError, SnapshotTrigger
from dsec.actuators.snapshotter import SnapshotConfig, Snapshotter
from dsec.actuators.sync_priority import SyncPriority
from dsec.actuators.worker_controls import WorkerControls
from dsec.schemas.actuations import (
    GIB,
    GradAccumulationParams,
    GradCompressionParams,
    MemoryCapParams,
    PrecisionParams,
    SamplerParams,
    SnapshotParams,
    SyncPriorityParams,
)


class FakeCudaMemory:
    """Test double for torch.cuda on a host without a GPU: records the fraction set."""

    def __init__(self, total_bytes: int) -> None:
        self.total = total_bytes
        self.fractions: list[tuple[float, int]] = []

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 2

    def total_bytes(self, device: int) -> int:
        return self.total

    def set_fraction(self, fraction: float, device: int) -> None:
        self.fractions.append((fraction, device))


class NoCuda(FakeCudaMemory):
    """Test double for a CPU host."""

    def is_available(self) -> bool:
        return False


def test_memory_cap_sets_the_cuda_fraction() -> None:
    cuda = FakeCudaMemory(total_bytes=16 * GIB)
    cap = MemoryCap(cuda=cuda, device=1)
    detail = cap.apply(MemoryCapParams(limit_bytes=4 * GIB))
    assert cuda.fractions == [(0.25, 1)] and "cuda:1" in detail
    assert cap.check() == 0  # the allocator enforces it: nothing to report
    MemoryCap(cuda=cuda).apply(MemoryCapParams(limit_bytes=32 * GIB))
    assert cuda.fractions[-1] == (1.0, 2)  # the current device; never above the whole card


def test_memory_cap_on_cpu_is_a_soft_budget_with_violations() -> None:
    used = [GIB]
    cap = MemoryCap(cuda=NoCuda(0), used_bytes=lambda: used[0])
    assert cap.check() == 0  # uncapped
    cap.apply(MemoryCapParams(limit_bytes=2 * GIB))
    assert cap.limit_bytes == 2 * GIB and cap.check() == 0
    used[0] = 3 * GIB
    assert cap.check() == GIB and cap.violations == 1


def test_precision_switches_real_autocast_and_scaler() -> None:
    controller = AutocastController("cpu", "bf16")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with controller():
        assert (a @ b).dtype == torch.bfloat16
    assert not controller.scaler.is_enabled()
    controller.apply(PrecisionParams(dtype="fp16"))
    with controller():
        assert (a @ b).dtype == torch.float16
    assert controller.scaler.is_enabled()
    controller.apply(PrecisionParams(dtype="fp32"))
    with controller():
        assert (a @ b).dtype == torch.float32
    assert not controller.scaler.is_enabled() and controller.switches == 2


def test_fp16_training_step_goes_through_the_grad_scaler() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    controller = AutocastController("cpu", "fp16")
    before = model.weight.detach().clone()
    initial_scale = controller.scaler.get_scale()
    for _ in range(8):  # a step whose scaled gradients overflow is skipped, the scale halved
        optimizer.zero_grad()
        with controller():
            loss = model(torch.randn(16, 8)).float().pow(2).mean()
        controller.backward(loss)
        controller.step(optimizer)
    assert 0 < controller.scaler.get_scale() <= initial_scale
    assert not torch.equal(before, model.weight)


@pytest.mark.parametrize("bits", [8, 4])
def test_gradient_quantisation_round_trips_within_half_a_step(bits: int) -> None:
    values = torch.randn(1001)
    codes, scale = quantise_gradient(values, bits)
    assert codes.dtype == torch.uint8
    assert codes.numel() == (1001 if bits == 8 else 501)
    assert scale.numel() == 4  # one per block of 256 values
    restored = dequantise_gradient(codes, scale, bits, 1001)
    step = scale.repeat_interleave(256)[:1001]
    assert bool(((restored - values).abs() <= step / 2 + 1e-6).all())


def test_small_gradients_beside_a_large_one_survive_four_bits() -> None:
    # One scale per block: a block of small gradients is not rounded to zero because
    # another block (another layer) holds a large one.
    values = torch.cat([torch.full((256,), 5.0), torch.randn(768) * 1e-3])
    codes, scale = quantise_gradient(values, 4)
    restored = dequantise_gradient(codes, scale, 4, values.numel())
    small, small_restored = values[256:], restored[256:]
    assert (small_restored != 0).float().mean() > 0.5
    relative = (small_restored - small).norm() / small.norm()
    assert relative < 0.3


def test_grad_compression_and_sync_priority_hold_their_settings() -> None:
    compression = GradCompression()
    compression.apply(GradCompressionParams(bits=4))
    assert compression.bits == 4
    priority = SyncPriority()
    priority.apply(SyncPriorityParams(level=-1))
    assert priority.level == -1


def test_accumulation_syncs_every_n_and_changes_at_a_window_boundary() -> None:
    accumulation = GradAccumulation()
    syncs = []
    for _ in range(2):
        with accumulation.micro_step() as sync:
            syncs.append(sync)
    accumulation.apply(GradAccumulationParams(steps=3))
    for _ in range(6):
        with accumulation.micro_step() as sync:
            syncs.append(sync)
    assert syncs == [True, True, False, False, True, False, False, True]
    with accumulation.micro_step():
        pass
    assert "next window" in accumulation.apply(GradAccumulationParams(steps=2))
    for _ in range(2):
        with accumulation.micro_step():
            pass
    assert accumulation.steps == 2


def test_sampler_gate_blocks_the_sampling_thread_until_resumed() -> None:
    gate = SamplerGate()
    gate.apply(SamplerParams(paused=True))
    assert gate.paused and not gate.wait_until_running(0.01)
    released = threading.Event()
    thread = threading.Thread(target=lambda: gate.wait_until_running(5) and released.set())
    thread.start()
    gate.apply(SamplerParams(paused=False))
    thread.join(5)
    assert released.is_set() and not gate.paused


def test_snapshot_trigger_needs_a_snapshotter_and_starts_one(tmp_path) -> None:
    trigger = SnapshotTrigger(lambda: 7)
    with pytest.raises(SnapshotNotConfiguredError):
        trigger.apply(SnapshotParams())
    model = torch.nn.Linear(4, 4)
    snapshotter = Snapshotter(model, None, SnapshotConfig(directory=tmp_path))
    trigger.attach(snapshotter, lambda: {"episode_head": 3})
    assert trigger.apply(SnapshotParams()) == "snapshot 0 started at step 7"
    snapshotter.close()
    assert snapshotter.stats.taken == 1


def test_worker_controls_register_every_action() -> None:
    controls = WorkerControls()
    hooks = ApplyHooks()
    controls.register(hooks)
    assert len(hooks.kinds()) == 7
    hooks.apply(PrecisionParams(dtype="bf16"))
    hooks.apply(SamplerParams(paused=True))
    state = controls.state()
    assert state["precision"] == "bf16" and state["sampler_paused"] is True

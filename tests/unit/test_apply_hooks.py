"""Each apply hook on its own: the worker's state actually changes, and a result says
applied only once the loop that uses the setting has taken it up."""

from __future__ import annotations

import threading

import pytest
import torch

from dsec.actuators import ApplyHooks
from dsec.actuators.effects import Effect, Pending
from dsec.actuators.grad_accumulation import GradAccumulation
from dsec.actuators.grad_compression import (
    GradCompression,
    dequantise_gradient,
    quantise_gradient,
)
from dsec.actuators.memory_cap import MemoryCap
from dsec.actuators.precision import AutocastController
from dsec.actuators.sampler import SamplerGate
from dsec.actuators.snapshot_trigger import SnapshotTrigger
from dsec.actuators.snapshotter import SnapshotConfig, Snapshotter
from dsec.actuators.sync_priority import SyncPriority
from dsec.actuators.worker_controls import WorkerControls
from dsec.schemas import ActionKind, ActuationStatus
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


class CudaMemoryDouble:
    """Test double for torch.cuda on a host without a GPU: records the fractions set and
    reads them back; ``allocated_bytes`` is what the process's live tensors hold and
    ``cached_bytes`` what ``empty_cache`` releases."""

    def __init__(self, total_bytes: int, allocated_bytes: int = 0,
                 cached_bytes: int = 0) -> None:
        self.total = total_bytes
        self.allocated_bytes = allocated_bytes
        self.cached_bytes = cached_bytes
        self.fractions: list[tuple[float, int]] = []
        self.emptied = 0

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 2

    def total_bytes(self, device: int) -> int:
        return self.total

    def set_fraction(self, fraction: float, device: int) -> None:
        if self.allocated_bytes > fraction * self.total:
            raise AssertionError("a fraction below the live allocations: the next one OOMs")
        self.fractions.append((fraction, device))

    def get_fraction(self, device: int) -> float:
        return self.fractions[-1][0] if self.fractions else 1.0

    def memory_allocated(self, device: int) -> int:
        return self.allocated_bytes

    def memory_reserved(self, device: int) -> int:
        return self.allocated_bytes + self.cached_bytes

    def empty_cache(self) -> None:
        self.emptied += 1
        self.cached_bytes = 0


class NoCuda(CudaMemoryDouble):
    """Test double for a CPU host."""

    def is_available(self) -> bool:
        return False


def settled(outcome: Effect | Pending) -> Effect:
    """The effect of an apply, settled now (as at the step boundary right after it)."""
    if isinstance(outcome, Effect):
        return outcome
    effect = outcome.settle()
    assert effect is not None, "not taken up yet"
    return effect


def test_memory_cap_sets_the_cuda_fraction_and_reads_it_back() -> None:
    cuda = CudaMemoryDouble(total_bytes=16 * GIB, allocated_bytes=GIB, cached_bytes=GIB)
    cap = MemoryCap(cuda=cuda, device=1)
    watched = cap.apply(MemoryCapParams(limit_bytes=4 * GIB))
    assert isinstance(watched, Pending) and watched.now is not None
    effect = watched.now
    assert cuda.fractions == [(0.25, 1)] and "cuda:1" in effect.detail
    assert (effect.status, effect.requested, effect.in_force) == (
        ActuationStatus.APPLIED, str(4 * GIB), str(4 * GIB))
    assert cuda.emptied == 1  # cached blocks released before the fraction is set
    assert cap.check() == 0  # the allocator enforces it: nothing to report
    MemoryCap(cuda=cuda).apply(MemoryCapParams(limit_bytes=32 * GIB))
    assert cuda.fractions[-1] == (1.0, 2)  # the current device; never above the whole card


def test_a_cuda_cap_below_what_the_process_holds_is_deferred_then_applied() -> None:
    cuda = CudaMemoryDouble(total_bytes=16 * GIB, allocated_bytes=6 * GIB,
                            cached_bytes=2 * GIB)
    cap = MemoryCap(cuda=cuda, device=0)
    pending = cap.apply(MemoryCapParams(limit_bytes=4 * GIB))
    assert isinstance(pending, Pending) and pending.now is not None
    assert pending.now.status is ActuationStatus.DEFERRED
    assert "holds 6442450944 bytes" in pending.now.detail
    assert cuda.fractions == [] and cuda.cached_bytes == 0  # released, and still over
    cuda.cached_bytes = GIB  # the allocator caches again while the cap waits
    assert pending.settle() is None and cuda.cached_bytes == 0 and cuda.fractions == []
    cuda.allocated_bytes = 3 * GIB  # the loop let go of what it held
    watched = pending.settle()
    assert isinstance(watched, Pending) and watched.now is not None
    effect = watched.now
    assert effect.status is ActuationStatus.APPLIED
    assert "deferred" in effect.detail and cuda.fractions == [(0.25, 0)]
    assert effect.in_force == str(4 * GIB) and cap.deferrals == 1


def test_a_cap_needs_a_tenth_of_itself_free_above_the_live_allocations() -> None:
    cuda = CudaMemoryDouble(total_bytes=16 * GIB, allocated_bytes=int(3.7 * GIB))
    pending = MemoryCap(cuda=cuda, device=0).apply(MemoryCapParams(limit_bytes=4 * GIB))
    assert isinstance(pending, Pending) and pending.now is not None
    assert pending.now.status is ActuationStatus.DEFERRED and cuda.fractions == []


def test_a_cap_the_live_allocations_grow_into_is_lifted_then_set_again() -> None:
    cuda = CudaMemoryDouble(total_bytes=16 * GIB, allocated_bytes=2 * GIB)
    cap = MemoryCap(cuda=cuda, device=0)
    watched = cap.apply(MemoryCapParams(limit_bytes=4 * GIB))
    assert isinstance(watched, Pending) and watched.now is not None
    assert watched.now.status is ActuationStatus.APPLIED
    cuda.allocated_bytes = int(2.5 * GIB)  # live tensors leak: the margin becomes 0.5 GiB
    assert watched.settle() is None and cap.margin_bytes(4 * GIB) == GIB // 2
    cuda.allocated_bytes = int(3.3 * GIB)  # 0.8 GiB more: 0.8 GiB must stay free
    waiting = watched.settle()
    assert isinstance(waiting, Pending) and waiting.now is not None
    assert waiting.now.status is ActuationStatus.DEFERRED and "lifted" in waiting.now.detail
    assert cuda.fractions == [(0.25, 0), (1.0, 0)] and cap.lifts == 1
    assert waiting.now.in_force == str(16 * GIB)
    assert waiting.settle() is None  # still too much live memory
    cuda.allocated_bytes = 2 * GIB  # the leak let go
    again = waiting.settle()
    assert isinstance(again, Pending) and again.now is not None
    assert again.now.status is ActuationStatus.APPLIED
    assert cuda.fractions[-1] == (0.25, 0)


def test_apply_hooks_report_a_watched_cap_lifted_and_set_again() -> None:
    cuda = CudaMemoryDouble(total_bytes=16 * GIB, allocated_bytes=2 * GIB)
    controls, hooks = WorkerControls(), ApplyHooks()
    controls.register(hooks)
    controls.memory_cap = MemoryCap(cuda=cuda, device=0)
    effect = hooks.apply(MemoryCapParams(limit_bytes=4 * GIB), "cap-1")
    assert effect is not None and effect.status is ActuationStatus.APPLIED
    assert hooks.in_force == {ActionKind.MEMORY_CAP: "cap-1"}
    cuda.allocated_bytes = int(2.6 * GIB)  # 0.6 GiB more: 0.6 GiB must stay free
    assert hooks.settle() == []  # watched, nothing to say
    cuda.allocated_bytes = int(3.5 * GIB)
    (lifted,) = hooks.settle()
    assert (lifted.actuation_id, lifted.effect.status) == ("cap-1", ActuationStatus.DEFERRED)
    assert hooks.in_force == {}
    cuda.allocated_bytes = int(2.5 * GIB)
    (again,) = hooks.settle()
    assert (again.actuation_id, again.effect.status) == ("cap-1", ActuationStatus.APPLIED)
    assert hooks.in_force == {ActionKind.MEMORY_CAP: "cap-1"}
    # a newer cap replaces the watched one without calling it superseded
    assert hooks.apply(MemoryCapParams(limit_bytes=8 * GIB), "cap-2").status \
        is ActuationStatus.APPLIED
    assert hooks.settle() == [] and hooks.pending() == {ActionKind.MEMORY_CAP: "cap-2"}


def test_memory_cap_on_cpu_is_a_soft_budget_in_force_once_the_probe_checks_it() -> None:
    used = [GIB]
    cap = MemoryCap(cuda=NoCuda(0), used_bytes=lambda: used[0])
    assert cap.check() == 0  # uncapped
    pending = cap.apply(MemoryCapParams(limit_bytes=2 * GIB))
    assert isinstance(pending, Pending) and pending.settle() is None  # nothing checked yet
    assert cap.limit_bytes == 2 * GIB and cap.check() == 0
    effect = pending.settle()
    assert effect.status is ActuationStatus.APPLIED and "soft budget" in effect.detail
    used[0] = 3 * GIB
    assert cap.check() == GIB and cap.violations == 1


def test_a_soft_budget_nothing_checks_is_unsupported() -> None:
    now = [0.0]
    cap = MemoryCap(cuda=NoCuda(0), used_bytes=lambda: 0, first_check_max_s=10,
                    clock_s=lambda: now[0])
    pending = cap.apply(MemoryCapParams(limit_bytes=2 * GIB))
    assert pending.settle() is None
    now[0] = 11.0
    effect = pending.settle()
    assert effect.status is ActuationStatus.UNSUPPORTED
    assert "dsec.init" in effect.detail


def test_precision_switches_real_autocast_and_scaler() -> None:
    controller = AutocastController("cpu", "bf16")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with controller():
        assert (a @ b).dtype == torch.bfloat16
    assert not controller.scaler.is_enabled()
    pending = controller.apply(PrecisionParams(dtype="fp16"))
    assert pending.settle() is None  # not in force before a forward pass ran under it
    with controller():
        assert (a @ b).dtype == torch.float16
    effect = pending.settle()
    assert effect.detail == "autocast bf16 -> fp16 with loss scaling"
    assert (effect.requested, effect.in_force) == ("fp16", "fp16")
    assert controller.scaler.is_enabled()
    controller.apply(PrecisionParams(dtype="fp32"))
    with controller():
        assert (a @ b).dtype == torch.float32
    assert not controller.scaler.is_enabled() and controller.switches == 2


def test_precision_a_loop_never_ran_under_is_unsupported_and_says_how_to_attach() -> None:
    controller = AutocastController("cpu")
    effect = controller.apply(PrecisionParams(dtype="fp16"))
    assert effect.status is ActuationStatus.UNSUPPORTED
    assert "dsec.autocast()" in effect.detail
    assert (effect.requested, effect.in_force) == ("fp16", None)
    with controller():  # a loop that attaches later runs what was asked
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.float16


def test_a_command_before_an_attached_loops_first_use_waits_for_it() -> None:
    # The node's desired state given back to a restarted worker whose loop is in place
    # but has not stepped yet: applied by that first step, not unsupported.
    for setting, params, value in (
            (AutocastController("cpu"), PrecisionParams(dtype="fp16"), "fp16"),
            (GradAccumulation(), GradAccumulationParams(steps=4), 4),
            (GradCompression(), GradCompressionParams(bits=4), 4),
            (SyncPriority(), SyncPriorityParams(level=-3), -3)):
        setting.mark_attached()
        pending = setting.apply(params)
        assert isinstance(pending, Pending) and pending.settle() is None
        setting.take(value)
        effect = pending.settle()
        assert effect.status is ActuationStatus.APPLIED and effect.in_force == str(value)


def test_undo_returns_to_the_workers_own_precision() -> None:
    for own in ("fp32", "bf16"):
        controller = AutocastController("cpu")
        with controller(own):
            pass
        settled_before = controller.apply(PrecisionParams(dtype="fp16"))
        with controller(own):
            pass
        assert settled(settled_before).in_force == "fp16"
        undo = controller.apply(PrecisionParams(dtype="original"))
        with controller(own):
            pass
        assert settled(undo).in_force == own and controller.state() == {
            "requested": own, "in_force": own, "original": own}


def test_a_setting_the_loop_stops_using_is_unsupported_after_a_while() -> None:
    now = [0.0]
    compression = GradCompression()
    compression._clock_s = lambda: now[0]
    compression.mark_attached()  # a hook is in place, but no bucket runs through it
    pending = compression.apply(GradCompressionParams(bits=8))
    assert pending.settle() is None
    now[0] = 121.0
    effect = pending.settle()
    assert effect.status is ActuationStatus.UNSUPPORTED and "120 s" in effect.detail


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
    unhooked = compression.apply(GradCompressionParams(bits=4))
    assert compression.bits == 4  # requested, kept for a hook attached later
    assert unhooked.status is ActuationStatus.UNSUPPORTED
    assert "dsec.watch_ddp(model)" in unhooked.detail
    priority = SyncPriority()
    unhooked = priority.apply(SyncPriorityParams(level=-1))
    assert priority.level == -1 and unhooked.status is ActuationStatus.UNSUPPORTED
    assert priority.weight() == 0.5 and priority.in_force == -1  # what a sync read back


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
    pending = accumulation.apply(GradAccumulationParams(steps=2))
    with accumulation.micro_step():
        pass  # the window of 3 is not cut short
    assert accumulation.steps == 3 and pending.settle() is None
    for _ in range(2):
        with accumulation.micro_step():
            pass
    assert accumulation.steps == 2
    effect = pending.settle()
    assert (effect.status, effect.requested, effect.in_force) == (
        ActuationStatus.APPLIED, "2", "2")


def test_accumulation_without_the_helper_is_unsupported_and_undo_returns_to_the_own() -> None:
    accumulation = GradAccumulation(steps=2)
    effect = accumulation.apply(GradAccumulationParams(steps=4))
    assert effect.status is ActuationStatus.UNSUPPORTED and "micro_step" in effect.detail
    assert accumulation.run_window(4) == 4  # a loop counting its own window says which
    undo = accumulation.apply(GradAccumulationParams(steps="original"))
    assert accumulation.run_window(accumulation.requested) == 2
    assert settled(undo).in_force == "2"


def test_sampler_gate_blocks_the_sampling_thread_until_resumed() -> None:
    gate = SamplerGate()
    unregistered = gate.apply(SamplerParams(paused=True))
    assert unregistered.status is ActuationStatus.UNSUPPORTED  # no sampling thread yet
    assert gate.paused and not gate.wait_until_running(0.01)
    released = threading.Event()
    thread = threading.Thread(target=lambda: gate.wait_until_running(5) and released.set())
    thread.start()
    resume = gate.apply(SamplerParams(paused=False))
    thread.join(5)
    assert released.is_set() and not gate.paused
    assert settled(resume).detail == "sampler resumed: the sampling thread passed the gate"


def test_a_pause_is_applied_once_the_sampling_thread_is_parked() -> None:
    gate = SamplerGate()
    gate.wait_until_running()  # the sampling thread's first batch: it is registered
    pause = gate.apply(SamplerParams(paused=True))
    assert pause.settle() is None  # mid-batch: not parked yet
    parked = threading.Thread(target=lambda: gate.wait_until_running(5))
    parked.start()
    effect = _wait_settled(pause)
    assert (effect.status, effect.requested, effect.in_force) == (
        ActuationStatus.APPLIED, "true", "true")
    gate.apply(SamplerParams(paused=False))
    parked.join(5)


def _wait_settled(pending: Pending, timeout_s: float = 5.0) -> Effect:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        effect = pending.settle()
        if effect is not None:
            return effect
        time.sleep(0.01)
    raise AssertionError("not settled")


def test_snapshot_trigger_needs_a_snapshotter_and_starts_one(tmp_path) -> None:
    trigger = SnapshotTrigger(lambda: 7)
    unsupported = trigger.apply(SnapshotParams())
    assert unsupported.status is ActuationStatus.UNSUPPORTED
    assert "dsec.enable_snapshots(model, optimizer)" in unsupported.detail
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
    assert state["precision"] == {"requested": "bf16", "in_force": None, "original": "fp32"}
    assert state["sampler_paused"]["requested"] is True
    assert controls.in_force()["precision"] is None  # nothing ran under it


def test_worker_controls_apply_through_a_control_replaced_after_registration() -> None:
    controls, hooks = WorkerControls(), ApplyHooks()
    controls.register(hooks)
    controls.memory_cap = MemoryCap(cuda=CudaMemoryDouble(total_bytes=8 * GIB))
    effect = hooks.apply(MemoryCapParams(limit_bytes=2 * GIB), "cap-1")
    assert effect.status is ActuationStatus.APPLIED and hooks.in_force["memory_cap"] == "cap-1"


def test_apply_hooks_settle_pending_effects_and_supersede_the_older() -> None:
    controller = AutocastController("cpu")
    hooks = ApplyHooks()
    hooks.register("precision", controller.apply)
    heard: list[tuple[str, str | None, str]] = []
    hooks.observe(lambda kind, aid, effect: heard.append((kind.value, aid, effect.status.value)))
    with controller():
        pass
    assert hooks.apply(PrecisionParams(dtype="fp16"), "first") is None
    assert hooks.apply(PrecisionParams(dtype="bf16"), "second") is None
    assert hooks.pending() == {"precision": "second"}
    with controller():
        pass
    settled_now = hooks.settle()
    assert [(s.actuation_id, s.effect.status.value, s.effect.in_force)
            for s in settled_now] == [("first", "superseded", None), ("second", "applied", "bf16")]
    assert heard == [("precision", "first", "superseded"), ("precision", "second", "applied")]
    assert hooks.in_force == {"precision": "second"} and hooks.settle() == []


def test_an_action_without_a_hook_is_unsupported_not_failed() -> None:
    effect = ApplyHooks().try_apply(SnapshotParams(), "a1")
    assert effect.status is ActuationStatus.UNSUPPORTED
    assert "@dsec.on_action('snapshot')" in effect.detail


def test_a_pending_command_sent_again_is_not_superseded_by_itself() -> None:
    controller = AutocastController("cpu")
    hooks = ApplyHooks()
    hooks.register("precision", controller.apply)
    with controller():
        pass
    hooks.apply(PrecisionParams(dtype="fp16"), "same")
    hooks.apply(PrecisionParams(dtype="fp16"), "same")  # re-sent as the worker registered
    with controller():
        pass
    assert [(s.actuation_id, s.effect.status.value) for s in hooks.settle()] == [
        ("same", "applied")]

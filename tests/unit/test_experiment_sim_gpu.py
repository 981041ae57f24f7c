"""The simulated GPU: NVML-shaped readings through the real sampler, enforced memory."""

from __future__ import annotations

import pytest

from dsec.actuators.memory_cap import MemoryCap
from dsec.experiment.sim_gpu import (
    GIB,
    THROTTLE_SW_THERMAL,
    SimulatedGpu,
    SimulatedOutOfMemoryError,
)
from dsec.ingest.nvml import NvmlSampler
from dsec.schemas.actuations import MemoryCapParams


class _Sink:
    def __init__(self) -> None:
        self.samples: list[tuple[str, dict]] = []

    def record_fields(self, kind: str, fields: dict) -> None:
        self.samples.append((kind, fields))


def test_the_nvml_sampler_reads_the_simulated_card_unchanged() -> None:
    gpu = SimulatedGpu("GPU-sim-0")
    gpu.set_working_set(3 * GIB)
    sink = _Sink()
    sampler = NvmlSampler(sink, 1.0, nvml=gpu)
    assert sampler.open()
    assert sampler.sample_once() == 1
    kind, fields = sink.samples[0]
    assert kind == "gpu"
    assert fields["gpu_uuid"] == "GPU-sim-0"
    assert fields["memory_used_bytes"] == 3 * GIB
    assert fields["memory_total_bytes"] == 24 * GIB
    assert {"utilisation_pct", "temperature_c", "sm_clock_mhz", "throttle_reasons",
            "power_w"} <= fields.keys()


def test_an_uncapped_leak_ends_in_an_oom() -> None:
    gpu = SimulatedGpu("g")
    gpu.set_working_set(3 * GIB)
    with pytest.raises(SimulatedOutOfMemoryError) as raised:
        for _ in range(30):
            gpu.fragment(1 * GIB)
    assert raised.value.limit_bytes == 24 * GIB
    assert gpu.used_bytes <= 24 * GIB


def test_under_a_fraction_the_allocator_reclaims_fragmented_blocks_instead() -> None:
    gpu = SimulatedGpu("g")
    gpu.set_working_set(3 * GIB)
    gpu.fragment(9 * GIB)
    cap = MemoryCap(cuda=gpu)
    assert "capped" in cap.apply(MemoryCapParams(limit_bytes=7 * GIB)).now.detail
    assert gpu.used_bytes <= 7 * GIB  # reclaimed when the cap landed
    for _ in range(50):
        gpu.fragment(1 * GIB)  # the leak goes on; the card never fills
    assert gpu.used_bytes <= 7 * GIB
    assert gpu.reclaimed_bytes > 40 * GIB
    assert cap.check() == 0  # enforced on the (simulated) device, not a soft budget


def test_live_memory_over_the_cap_is_still_an_oom() -> None:
    gpu = SimulatedGpu("g")
    gpu.set_fraction(4 / 24, 0)
    with pytest.raises(SimulatedOutOfMemoryError):
        gpu.set_working_set(5 * GIB)


def _card_holding_live_memory() -> SimulatedGpu:
    """3 GiB working set, 6 GiB of held live tensors, 4 GiB of fragmented blocks."""
    gpu = SimulatedGpu("g")
    gpu.set_working_set(3 * GIB)
    gpu.hold(6 * GIB)
    gpu.fragment(4 * GIB)
    return gpu


def test_a_fraction_set_below_held_memory_makes_the_next_allocation_fail() -> None:
    """What a cap did before it knew what the process holds: caused the OOM."""
    gpu = _card_holding_live_memory()
    gpu.set_fraction(7 / 24, 0)  # fragmented blocks go, the held tensors cannot
    assert gpu.fragmented_bytes == 0 and gpu.live_bytes == 9 * GIB
    with pytest.raises(SimulatedOutOfMemoryError):
        gpu.set_working_set(3 * GIB)


def test_the_memory_cap_defers_below_held_memory_and_applies_once_it_is_let_go() -> None:
    gpu = _card_holding_live_memory()
    cap = MemoryCap(cuda=gpu)
    pending = cap.apply(MemoryCapParams(limit_bytes=7 * GIB))
    assert pending.now.status.value == "deferred"
    assert gpu.fraction is None and gpu.fragmented_bytes == 0  # cached blocks released
    for _ in range(5):  # training goes on, the leak's blocks released at each re-check
        gpu.set_working_set(3 * GIB)
        gpu.fragment(2 * GIB)
        assert pending.settle() is None
    gpu.release_held()
    effect = pending.settle().now
    assert effect.status.value == "applied" and gpu.fraction == pytest.approx(7 / 24)
    gpu.set_working_set(3 * GIB)  # no OOM: the cap came when the live memory fit under it
    for _ in range(20):
        gpu.fragment(1 * GIB)
    assert gpu.used_bytes <= 7 * GIB


def test_thermal_fault_heats_throttles_and_slows_kernels() -> None:
    now = [0.0]
    gpu = SimulatedGpu("g", clock=lambda: now[0])
    gpu.thermal_fault = True
    assert gpu.clock_ratio == 1.0
    now[0] = 30.0  # well past the thermal time constant
    temperature = gpu.nvmlDeviceGetTemperature(0, 0)
    assert temperature >= gpu.spec.throttle_temperature_c
    assert gpu.nvmlDeviceGetCurrentClocksEventReasons(0) == THROTTLE_SW_THERMAL
    assert gpu.clock_ratio < 1.0
    assert gpu.nvmlDeviceGetClockInfo(0, 1) < gpu.spec.max_sm_clock_mhz
    gpu.thermal_fault = False
    assert gpu.nvmlDeviceGetCurrentClocksEventReasons(0) == 0


def test_utilisation_is_the_busy_share_of_wall_time() -> None:
    now = [0.0]
    gpu = SimulatedGpu("g", clock=lambda: now[0])
    gpu.run_kernels(0.1)
    now[0] = 0.2
    assert gpu.utilisation_pct() == pytest.approx(50.0, abs=5)

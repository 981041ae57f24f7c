"""SimulatedGpu: a stand-in GPU for CPU hosts, driven by a worker's real activity.

It answers the pynvml functions the NVML sampler calls (so ``NvmlSampler(nvml=gpu)``
reads it unchanged; on a GPU host the real pynvml takes its place) and the slice of
``torch.cuda`` that the memory-cap actuator uses. Device memory is enforced: an
allocation past what the card (or the per-process fraction) allows raises
``SimulatedOutOfMemoryError``; the worker lets it kill the process, as a CUDA OOM does.

Memory model, stated plainly: ``allocated`` is the live working set of the step (base
plus activations proportional to the batch); ``held`` is live memory beyond it, tensors
the process keeps referenced (a leak of live tensors), which nothing can reclaim until
the process lets go of them; ``fragmented`` is memory the simulated caching allocator
keeps in split, unusable blocks. Episode-length-dependent tensor shapes fragment it; a
leak fault makes a card fragment on long episodes. Without a per-process fraction the
allocator keeps those blocks until the card is full and the next allocation fails (OOM).
Under a fraction it garbage-collects them when the fraction is reached, as PyTorch's
allocator does with ``garbage_collection_threshold``, so it stays at the cap;
``empty_cache`` releases them at once. A fraction below the live memory (allocated plus
held) makes the next allocation fail, as on a real card.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

GIB = 1 << 30
THROTTLE_SW_THERMAL = 0x20  # NVML clocks-event reason: software thermal slowdown


class SimulatedOutOfMemoryError(RuntimeError):
    """What a CUDA OOM is on the simulated card: carries what was asked and what was left."""

    def __init__(self, requested_bytes: int, limit_bytes: int, used_bytes: int) -> None:
        super().__init__(
            f"simulated GPU out of memory: tried to allocate {requested_bytes} bytes with "
            f"{used_bytes} in use of a {limit_bytes}-byte limit"
        )
        self.requested_bytes = requested_bytes
        self.limit_bytes = limit_bytes
        self.used_bytes = used_bytes


@dataclass(frozen=True)
class GpuSpec:
    name: str = "dsec SimulatedGpu 24GB"
    total_bytes: int = 24 * GIB
    max_sm_clock_mhz: float = 1980.0
    throttled_sm_clock_mhz: float = 1150.0
    idle_temperature_c: float = 38.0
    busy_temperature_c: float = 68.0
    throttle_temperature_c: float = 87.0
    idle_power_w: float = 60.0
    busy_power_w: float = 300.0


class SimulatedGpu:
    """One simulated card. Thread-safe: the training thread drives it, the NVML sampler
    thread reads it."""

    NVMLError = RuntimeError

    def __init__(self, uuid: str, spec: GpuSpec | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec or GpuSpec()
        self.uuid = uuid
        self._now = clock
        self._lock = threading.Lock()
        self.allocated_bytes = 0
        self.held_bytes = 0
        self.fragmented_bytes = 0
        self.fraction: float | None = None
        self.reclaimed_bytes = 0
        self.thermal_fault = False
        # A straggling card: kernels this many times slower, at full clock and no heat.
        self.slowdown = 1.0
        self._busy_s = 0.0
        self.busy_total_s = 0.0
        self._window_start_s = self._now()
        self._last_utilisation_pct = 0.0
        self._temperature_c = self.spec.idle_temperature_c
        self._temperature_at_s = self._now()

    # -- memory ------------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        return self.allocated_bytes + self.held_bytes + self.fragmented_bytes

    @property
    def live_bytes(self) -> int:
        return self.allocated_bytes + self.held_bytes

    @property
    def limit_bytes(self) -> int:
        if self.fraction is None:
            return self.spec.total_bytes
        return int(self.fraction * self.spec.total_bytes)

    def set_working_set(self, allocated_bytes: int) -> None:
        """The step's live allocations; raises SimulatedOutOfMemoryError when they do not fit."""
        with self._lock:
            self.allocated_bytes = 0
            self._fit(allocated_bytes)
            self.allocated_bytes = allocated_bytes

    def fragment(self, nbytes: int) -> None:
        """The allocator splits ``nbytes`` more into unusable blocks (a leak)."""
        with self._lock:
            self._fit(nbytes)
            self.fragmented_bytes += nbytes

    def hold(self, nbytes: int) -> None:
        """The process keeps ``nbytes`` more of live tensors (a leak nothing reclaims)."""
        with self._lock:
            self._fit(nbytes)
            self.held_bytes += nbytes

    def release_held(self) -> int:
        """The process lets go of the live tensors it held; how many bytes."""
        with self._lock:
            released, self.held_bytes = self.held_bytes, 0
            return released

    def _fit(self, nbytes: int) -> None:
        limit = self.limit_bytes
        if self.used_bytes + nbytes <= limit:
            return
        if self.fraction is not None:  # garbage collection at the fraction
            free_needed = self.used_bytes + nbytes - limit
            released = min(self.fragmented_bytes, free_needed)
            self.fragmented_bytes -= released
            self.reclaimed_bytes += released
            if self.used_bytes + nbytes <= limit:
                return
        raise SimulatedOutOfMemoryError(nbytes, limit, self.used_bytes)

    # -- compute, clocks, heat -----------------------------------------------------------
    @property
    def clock_ratio(self) -> float:
        """Current SM clock over the maximum: simulated kernels take 1/ratio longer."""
        if self._throttled():
            return self.spec.throttled_sm_clock_mhz / self.spec.max_sm_clock_mhz
        return 1.0

    def run_kernels(self, seconds_at_full_clock: float) -> float:
        """Simulated device compute: sleeps the kernel time at the current clock; returns it."""
        duration_s = seconds_at_full_clock / self.clock_ratio * self.slowdown
        time.sleep(duration_s)
        with self._lock:
            self._busy_s += duration_s
            self.busy_total_s += duration_s
        return duration_s

    def _throttled(self) -> bool:
        return self.thermal_fault and self._temperature_c >= self.spec.throttle_temperature_c - 5

    def _update_thermals(self, now_s: float) -> None:
        target = (self.spec.idle_temperature_c
                  + (self.spec.busy_temperature_c - self.spec.idle_temperature_c)
                  * self._last_utilisation_pct / 100.0)
        if self.thermal_fault:
            target = self.spec.throttle_temperature_c + 4.0
        elapsed_s = max(0.0, now_s - self._temperature_at_s)
        approach = min(1.0, elapsed_s / 4.0)  # ~4 s thermal time constant
        self._temperature_c += (target - self._temperature_c) * approach
        self._temperature_at_s = now_s

    def utilisation_pct(self) -> float:
        """Busy share of wall time since the last reading (the NVML sampler's interval)."""
        with self._lock:
            now_s = self._now()
            span_s = now_s - self._window_start_s
            if span_s >= 0.2:
                self._last_utilisation_pct = min(100.0, 100.0 * self._busy_s / span_s)
                self._busy_s = 0.0
                self._window_start_s = now_s
            self._update_thermals(now_s)
            return self._last_utilisation_pct

    # -- the torch.cuda slice the memory-cap actuator uses (CudaMemoryApi) ----------------
    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def total_bytes(self, device: int) -> int:
        return self.spec.total_bytes

    def set_fraction(self, fraction: float, device: int) -> None:
        with self._lock:
            self.fraction = fraction
            if self.used_bytes > self.limit_bytes:
                released = min(self.fragmented_bytes, self.used_bytes - self.limit_bytes)
                self.fragmented_bytes -= released
                self.reclaimed_bytes += released

    def get_fraction(self, device: int) -> float:
        return 1.0 if self.fraction is None else self.fraction

    def memory_allocated(self, device: int) -> int:
        return self.live_bytes

    def memory_reserved(self, device: int) -> int:
        return self.used_bytes

    def empty_cache(self) -> None:
        with self._lock:
            self.reclaimed_bytes += self.fragmented_bytes
            self.fragmented_bytes = 0

    # -- the pynvml functions the NVML sampler calls -------------------------------------
    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index != 0:
            raise self.NVMLError("Invalid Argument")
        return 0

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.uuid

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.spec.name

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        used = self.used_bytes
        return SimpleNamespace(used=used, total=self.spec.total_bytes,
                               free=self.spec.total_bytes - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        # The card's one process is the worker driving it (this process).
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=self.used_bytes)]

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=round(self.utilisation_pct()), memory=0)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        with self._lock:
            self._update_thermals(self._now())
            return round(self._temperature_c)

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        return round(self.spec.max_sm_clock_mhz * self.clock_ratio)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return THROTTLE_SW_THERMAL if self._throttled() else 0

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        share = self._last_utilisation_pct / 100.0
        watts = self.spec.idle_power_w + (self.spec.busy_power_w - self.spec.idle_power_w) * share
        return round(watts * 1000)

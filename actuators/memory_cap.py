"""Memory cap: a hard per-process fraction on a GPU, a soft budget on a CPU host.

On a GPU a fraction below what the process already holds would make its next allocation
fail: the cap would cause the OOM it exists to prevent. So cached blocks are released
first (``empty_cache``); if the live allocations still exceed the cap, the cap is
``deferred`` and set at the first step boundary where they have fallen under it. The
fraction is read back from the allocator once set.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Protocol

from dsec.actuators.effects import Effect, Pending
from dsec.schemas import ActuationStatus
from dsec.schemas.actuations import MemoryCapParams

# How long a soft budget waits for a first check by the probe before it is unsupported.
FIRST_CHECK_MAX_S = 120.0


class CudaMemoryApi(Protocol):
    """The slice of ``torch.cuda`` a memory cap needs (a seam for hosts without a GPU)."""

    def is_available(self) -> bool: ...
    def current_device(self) -> int: ...
    def total_bytes(self, device: int) -> int: ...
    def set_fraction(self, fraction: float, device: int) -> None: ...
    def get_fraction(self, device: int) -> float: ...
    def memory_allocated(self, device: int) -> int: ...  # live tensors
    def memory_reserved(self, device: int) -> int: ...  # live plus cached blocks
    def empty_cache(self) -> None: ...


class TorchCudaMemory:
    def is_available(self) -> bool:
        import torch

        return torch.cuda.is_available()

    def current_device(self) -> int:
        import torch

        return int(torch.cuda.current_device())

    def total_bytes(self, device: int) -> int:
        import torch

        return int(torch.cuda.get_device_properties(device).total_memory)

    def set_fraction(self, fraction: float, device: int) -> None:
        import torch

        torch.cuda.set_per_process_memory_fraction(fraction, device)

    def get_fraction(self, device: int) -> float:
        import torch

        return float(torch.cuda.get_per_process_memory_fraction(device))

    def memory_allocated(self, device: int) -> int:
        import torch

        return int(torch.cuda.memory_allocated(device))

    def memory_reserved(self, device: int) -> int:
        import torch

        return int(torch.cuda.memory_reserved(device))

    def empty_cache(self) -> None:
        import torch

        torch.cuda.empty_cache()


def process_rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc``; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class MemoryCap:
    """Applies ``memory_cap``; on CPU the budget is checked by the probe (``check``) and is
    in force only once it has been."""

    what = "memory cap"

    def __init__(
        self,
        cuda: CudaMemoryApi | None = None,
        device: int | None = None,  # None: the current CUDA device when the cap is applied
        used_bytes: Callable[[], int] = process_rss_bytes,
        *,
        first_check_max_s: float = FIRST_CHECK_MAX_S,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cuda = cuda if cuda is not None else TorchCudaMemory()
        self._device = device
        self._used_bytes = used_bytes
        self._first_check_max_s = first_check_max_s
        self._clock_s = clock_s
        self.limit_bytes: int | None = None  # requested
        self.in_force_bytes: int | None = None  # read back
        self.enforced_on_gpu = False
        self.deferrals = 0
        self.checks = 0
        self.violations = 0
        self.last_violation_bytes = 0

    def apply(self, params: MemoryCapParams) -> Effect | Pending:
        limit = self.limit_bytes = params.limit_bytes
        if not self._cuda.is_available():
            return self._soft_budget(limit)
        self.enforced_on_gpu = True  # the allocator enforces it, once set
        device = self._device if self._device is not None else self._cuda.current_device()
        self._cuda.empty_cache()
        held = self._cuda.memory_allocated(device)
        if held <= limit:
            return self._set(device, limit, "")
        self.deferrals += 1
        deferred = Effect(
            ActuationStatus.DEFERRED,
            f"cuda:{device} cap of {limit} bytes deferred: the process holds {held} bytes "
            "after releasing cached blocks; set once its use falls under the cap",
            str(limit), None if self.in_force_bytes is None else str(self.in_force_bytes))

        def settle() -> Effect | None:
            if self._cuda.memory_allocated(device) > limit:
                if self._cuda.memory_reserved(device) > limit:
                    # cached blocks must not take the card while the cap waits
                    self._cuda.empty_cache()
                return None
            self._cuda.empty_cache()
            return self._set(device, limit, " (deferred until the process held less)")

        return Pending(settle, now=deferred)

    def _set(self, device: int, limit: int, note: str) -> Effect:
        total = self._cuda.total_bytes(device)
        self._cuda.set_fraction(min(1.0, limit / total), device)
        fraction = self._cuda.get_fraction(device)
        self.in_force_bytes = int(fraction * total)
        return Effect.applied(f"cuda:{device} capped at {fraction:.3f} of {total} bytes{note}",
                              limit, self.in_force_bytes)

    def _soft_budget(self, limit: int) -> Effect | Pending:
        self.enforced_on_gpu = False
        mark, asked_s = self.checks, self._clock_s()

        def settle() -> Effect | None:
            if self.checks > mark:
                self.in_force_bytes = limit
                return Effect.applied(f"soft budget {limit} bytes (no GPU), checked by the "
                                      "probe against the process RSS", limit, limit)
            if self._clock_s() - asked_s < self._first_check_max_s:
                return None
            return Effect.unsupported(
                f"soft memory budget of {limit} bytes", "no GPU, and nothing checks the "
                "budget", "call dsec.init(...): its probe checks it at step boundaries", limit)

        return Pending(settle)

    def check(self) -> int:
        """Bytes over the soft budget now (0 when within it, capped on GPU, or uncapped)."""
        if self.limit_bytes is None or self.enforced_on_gpu:
            return 0
        self.checks += 1
        over = self._used_bytes() - self.limit_bytes
        if over <= 0:
            return 0
        self.violations += 1
        self.last_violation_bytes = over
        return over

    def state(self) -> dict[str, int | None]:
        return {"requested": self.limit_bytes, "in_force": self.in_force_bytes,
                "original": None}

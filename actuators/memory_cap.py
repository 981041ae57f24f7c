"""Memory cap: a hard per-process fraction on a GPU, a soft budget on a CPU host."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

from dsec.schemas.actuations import MemoryCapParams


class CudaMemoryApi(Protocol):
    """The slice of ``torch.cuda`` a memory cap needs (a seam for hosts without a GPU)."""

    def is_available(self) -> bool: ...
    def current_device(self) -> int: ...
    def total_bytes(self, device: int) -> int: ...
    def set_fraction(self, fraction: float, device: int) -> None: ...


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


def process_rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc``; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class MemoryCap:
    """Applies ``memory_cap``; on CPU the budget is read by the loop and checked by the probe."""

    def __init__(
        self,
        cuda: CudaMemoryApi | None = None,
        device: int | None = None,  # None: the current CUDA device when the cap is applied
        used_bytes: Callable[[], int] = process_rss_bytes,
    ) -> None:
        self._cuda = cuda if cuda is not None else TorchCudaMemory()
        self._device = device
        self._used_bytes = used_bytes
        self.limit_bytes: int | None = None
        self.enforced_on_gpu = False
        self.violations = 0
        self.last_violation_bytes = 0

    def apply(self, params: MemoryCapParams) -> str:
        self.limit_bytes = params.limit_bytes
        if self._cuda.is_available():
            device = self._device if self._device is not None else self._cuda.current_device()
            total = self._cuda.total_bytes(device)
            fraction = min(1.0, params.limit_bytes / total)
            self._cuda.set_fraction(fraction, device)
            self.enforced_on_gpu = True
            return f"cuda:{device} capped at {fraction:.3f} of {total} bytes"
        self.enforced_on_gpu = False
        return f"soft budget {params.limit_bytes} bytes (no GPU)"

    def check(self) -> int:
        """Bytes over the soft budget now (0 when within it, capped on GPU, or uncapped)."""
        if self.limit_bytes is None or self.enforced_on_gpu:
            return 0
        over = self._used_bytes() - self.limit_bytes
        if over <= 0:
            return 0
        self.violations += 1
        self.last_violation_bytes = over
        return over

"""Memory cap: a hard per-process fraction on a GPU, a soft budget on a CPU host.

On a GPU a fraction below what the process's live tensors need makes its next allocation
fail: the cap would cause the OOM it exists to prevent. So cached blocks are released
first (``empty_cache``), and the cap is set only while the live allocations fit under it
with a margin: a tenth of the cap, or the most they have grown between two step
boundaries, whichever is more. Otherwise it is ``deferred`` and set at the first step
boundary where they fit. Once set it is watched at every step boundary: live memory that
grows into the margin (a leak of live tensors, which no cap reclaims) gets the cap lifted,
reported ``deferred`` with the reason, and set again once the live allocations fit. The
fraction is read back from the allocator whenever it is set or lifted.
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
# The least of a cap kept free above the live allocations while it is set.
HEADROOM_SHARE = 0.1
# The margin is at least this many times the most the live allocations grew between two
# step boundaries (a step's working set, or an episode's leak, that lands at once).
GROWTH_MARGIN_FACTOR = 1.0


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
        self.lifts = 0  # caps lifted because the live allocations outgrew them
        self.max_growth_bytes = 0  # between two step boundaries, while a cap was watched
        self._last_live_bytes: int | None = None
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
        self._last_live_bytes = None  # growth counts between step boundaries watched
        live, margin = self._live(device), self.margin_bytes(limit)
        if live + margin <= limit:
            return self._set(device, limit, "")
        self.deferrals += 1
        return self._wait(device, limit, self._deferred(
            limit, f"cuda:{device} cap of {limit} bytes deferred: the process holds {live} "
            f"bytes after releasing cached blocks, and {margin} must stay free under the "
            "cap; set once they fit"))

    def _deferred(self, limit: int, detail: str) -> Effect:
        in_force = None if self.in_force_bytes is None else str(self.in_force_bytes)
        return Effect(ActuationStatus.DEFERRED, detail, str(limit), in_force)

    def margin_bytes(self, limit: int) -> int:
        """What must stay free under a cap above the live allocations."""
        return max(int(HEADROOM_SHARE * limit), int(GROWTH_MARGIN_FACTOR * self.max_growth_bytes))

    def _live(self, device: int) -> int:
        """The live allocations now; notes how much they grew since the last look."""
        live = self._cuda.memory_allocated(device)
        if self._last_live_bytes is not None:
            self.max_growth_bytes = max(self.max_growth_bytes, live - self._last_live_bytes)
        self._last_live_bytes = live
        return live

    def _set(self, device: int, limit: int, note: str) -> Pending:
        """Sets the cap and watches it at every step boundary from then on."""
        total = self._cuda.total_bytes(device)
        self._cuda.set_fraction(min(1.0, limit / total), device)
        fraction = self._cuda.get_fraction(device)
        self.in_force_bytes = int(fraction * total)
        applied = Effect.applied(f"cuda:{device} capped at {fraction:.3f} of {total} bytes{note}",
                                 limit, self.in_force_bytes)

        def watch() -> Pending | None:
            live = self._live(device)
            margin = self.margin_bytes(limit)
            if live + margin <= limit:
                return None
            self._cuda.set_fraction(1.0, device)
            self.in_force_bytes = int(self._cuda.get_fraction(device) * total)
            self.lifts += 1
            return self._wait(device, limit, self._deferred(
                limit, f"cuda:{device} cap of {limit} bytes lifted: the live allocations "
                f"reached {live} bytes, within {margin} of it, and no cap reclaims live "
                "tensors (the next allocation over it would fail: an OOM); set again once "
                "they fit"))

        return Pending(watch, now=applied)

    def _wait(self, device: int, limit: int, now: Effect) -> Pending:
        """Waits for the live allocations to fit under the cap with its margin, then sets it."""

        def settle() -> Pending | None:
            if self._live(device) + self.margin_bytes(limit) > limit:
                if self._cuda.memory_reserved(device) > limit:
                    # cached blocks must not take the card while the cap waits
                    self._cuda.empty_cache()
                return None
            self._cuda.empty_cache()
            return self._set(device, limit, " (deferred until the live allocations fitted)")

        return Pending(settle, now=now)

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

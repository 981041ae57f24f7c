"""``torch.cuda.memory_stats`` of the training thread's device, sampled off the training thread."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol


class FieldSink(Protocol):
    def record_fields(self, kind: str, fields: dict[str, Any]) -> None: ...


def fragmentation_ratio(allocated_bytes: int, reserved_bytes: int) -> float:
    """Share of the allocator's reserved memory that holds no tensor: 0 when none is reserved."""
    if reserved_bytes <= 0:
        return 0.0
    return min(1.0, max(0.0, (reserved_bytes - allocated_bytes) / reserved_bytes))


def memory_fields(device_index: int, stats: Mapping[str, int]) -> dict[str, Any]:
    """The ``cuda_memory`` sample's fields from one ``torch.cuda.memory_stats`` result."""
    allocated = int(stats.get("allocated_bytes.all.current", 0))
    reserved = int(stats.get("reserved_bytes.all.current", 0))
    return {
        "device_index": device_index,
        "allocated_bytes": allocated,
        "reserved_bytes": reserved,
        "active_bytes": int(stats.get("active_bytes.all.current", 0)),
        "peak_allocated_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
        "fragmentation_ratio": fragmentation_ratio(allocated, reserved),
        "oom_count": int(stats.get("num_ooms", 0)),
        "alloc_retry_count": int(stats.get("num_alloc_retries", 0)),
    }


class CudaMemoryCollector:
    """A probe collector; ``bind_device`` runs on the training thread, where the device is known.

    It never initialises CUDA itself: a process that has not touched the GPU gets no samples.
    """

    def __init__(
        self,
        sink: FieldSink,
        interval_s: float,
        read_stats: Callable[[int], Mapping[str, int]] | None = None,
    ) -> None:
        self._sink = sink
        self._interval_s = interval_s
        self._read_stats = read_stats
        self._device_index: int | None = None
        self._next_s = 0.0
        self._next_bind_check_s = 0.0

    @property
    def device_index(self) -> int | None:
        """The CUDA device the training thread made current, once it has."""
        return self._device_index

    def bind_device(self) -> None:
        if self._device_index is not None:
            return
        now_s = time.monotonic()
        if now_s < self._next_bind_check_s:  # a CPU-only process asks at most once a second
            return
        self._next_bind_check_s = now_s + 1.0
        import torch

        # ``is_initialized`` first: a flag, where ``is_available`` asks the driver (0.3 ms
        # on a host whose torch has CUDA and no GPU)
        if torch.cuda.is_initialized() and torch.cuda.is_available():
            self._device_index = torch.cuda.current_device()

    def __call__(self) -> None:
        if self._device_index is None:
            return
        now_s = time.monotonic()
        if now_s < self._next_s:
            return
        self._next_s = now_s + self._interval_s
        if self._read_stats is None:
            import torch

            stats = torch.cuda.memory_stats(self._device_index)
        else:
            stats = self._read_stats(self._device_index)
        self._sink.record_fields("cuda_memory", memory_fields(self._device_index, stats))

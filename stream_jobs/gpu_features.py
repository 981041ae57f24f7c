"""GPU features per (worker, GPU), and the worker's over all its GPUs.

Card-wide figures (NVML's memory in use, temperature, throttling) describe the card and
every process on it; the worker's own device memory is what a per-worker quota is about.
That is NVML's per-process figure where the probe reads one, and the CUDA allocator's
reserved bytes where it samples those; each is a floor of what the process holds (NVML's
adds the CUDA context), so the larger of the two is taken.

A worker on several GPUs gets one set per GPU (a feature event each) and, in its own
events, the fullest or hottest of its cards and the sum of its own memory over them, so
that no GPU's figures overwrite another's.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dsec.schemas.frames import Frame
from dsec.schemas.units import ms_to_s
from dsec.stream_jobs import stats
from dsec.stream_jobs.worker_state import CudaDevice, GpuState

__all__ = ["cuda_devices_after", "cuda_features", "gpu_features", "worker_gpu_features"]


def gpu_features(gpu: GpuState) -> dict[str, float]:
    """One GPU's features as the worker sees it."""
    out = {
        "gpu_memory_used_bytes": float(gpu.last_used_bytes),
        "gpu_thermal_throttle_events": float(gpu.throttle_onset_count),
        "gpu_thermal_throttled": float(gpu.throttled),
    }
    growth = stats.linear_slope(
        ms_to_s(np.asarray(gpu.recent_times_ms)), np.asarray(gpu.recent_used_bytes))
    if growth is not None:
        out["gpu_memory_growth_bytes_per_s"] = growth
    if gpu.process_used_bytes is not None:
        out["gpu_process_memory_bytes"] = float(gpu.process_used_bytes)
    if gpu.utilisation_pct is not None:
        out["gpu_utilisation_pct"] = gpu.utilisation_pct
    if gpu.temperature_c is not None:
        out["gpu_temperature_c"] = gpu.temperature_c
    return out


# How the worker's features combine its GPUs' sets.
_COMBINE = {
    "gpu_memory_used_bytes": max, "gpu_memory_growth_bytes_per_s": max,
    "gpu_thermal_throttle_events": sum, "gpu_thermal_throttled": max,
    "gpu_process_memory_bytes": sum, "gpu_temperature_c": max,
    "gpu_utilisation_pct": lambda values: sum(values) / len(values),
}


def worker_gpu_features(gpus: Mapping[str, GpuState],
                        cuda_devices: Mapping[int, CudaDevice]) -> dict[str, float]:
    """The worker's GPU features over all its GPUs and CUDA devices."""
    sets = [gpu_features(gpu) for gpu in gpus.values()]
    out = {}
    for name, combine in _COMBINE.items():
        values = [features[name] for features in sets if name in features]
        if values:
            out[name] = float(combine(values))
    reserved = [device.reserved_bytes for device in cuda_devices.values()]
    if reserved:
        out["gpu_process_memory_bytes"] = float(max(
            sum(reserved), out.get("gpu_process_memory_bytes", 0.0)))
    return out


def cuda_devices_after(devices: Mapping[int, CudaDevice], frame: Frame) -> dict[int, CudaDevice]:
    """The worker's CUDA devices with the last sample of each in ``frame``."""
    out = dict(devices)
    for row in range(frame["device_index"].size):
        index = int(frame["device_index"][row])
        time_ms = int(frame["event_time_ms"][row])
        before = out.get(index)
        if before is not None and before.time_ms > time_ms:
            continue
        out[index] = CudaDevice(
            time_ms=time_ms, allocated_bytes=int(frame["allocated_bytes"][row]),
            reserved_bytes=int(frame["reserved_bytes"][row]),
            fragmentation_ratio=float(frame["fragmentation_ratio"][row]),
            oom_count=int(frame["oom_count"][row]))
    return out


def cuda_features(devices: Mapping[int, CudaDevice]) -> dict[str, float]:
    """The CUDA allocator's figures over the worker's devices."""
    if not devices:
        return {}
    allocated = sum(d.allocated_bytes for d in devices.values())
    reserved = sum(d.reserved_bytes for d in devices.values())
    return {
        "cuda_memory_allocated_bytes": float(allocated),
        "cuda_memory_reserved_bytes": float(reserved),
        "cuda_memory_fragmentation_ratio": (
            max(0.0, (reserved - allocated) / reserved) if reserved else 0.0),
        "cuda_oom_count": float(sum(d.oom_count for d in devices.values())),
    }

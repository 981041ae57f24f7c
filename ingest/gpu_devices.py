"""Which GPUs this process uses, so that the probe samples those and not every GPU on the
host (whose figures would then be reported by every worker on it, the last one winning).

In order: the CUDA device the training thread made current; else ``LOCAL_RANK``, the
device a launcher (torchrun, DeepSpeed) gives each local process; both counted among
``CUDA_VISIBLE_DEVICES`` where that is set. Without either, every visible device is the
process's (a process that drives several cards, or one not yet told its rank); with no
``CUDA_VISIBLE_DEVICES`` and no rank, nothing says, and the caller samples every GPU.

``CUDA_VISIBLE_DEVICES`` entries are device indices or UUIDs; an index is taken as
NVML's, which is CUDA's order under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (what cluster
launchers set): give UUIDs, or the probe's ``gpu_indices``, where it is not.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["own_devices"]


def _rank(env: Mapping[str, str]) -> int | None:
    try:
        rank = int(env.get("LOCAL_RANK", ""))
    except ValueError:
        return None
    return rank if rank >= 0 else None


def own_devices(env: Mapping[str, str], current_device: int | None = None) -> list[str] | None:
    """The devices this process uses, as NVML indices (digits) or UUIDs; None where
    nothing says which."""
    visible_text = env.get("CUDA_VISIBLE_DEVICES")
    visible = None if visible_text is None else [
        entry.strip() for entry in visible_text.split(",") if entry.strip()]
    ordinal = current_device if current_device is not None else _rank(env)
    if visible is not None:
        if ordinal is not None and ordinal < len(visible):
            return [visible[ordinal]]
        return visible
    return None if ordinal is None else [str(ordinal)]

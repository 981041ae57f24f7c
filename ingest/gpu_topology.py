"""Each GPU's place on its node, read from NVML once (topology does not change while a
node runs): its NUMA node, the CPUs close to it, and what links it to every other GPU
(NVLink where an active link reaches the other's PCI bus, else the PCIe common ancestor).

Every reading is taken on its own: a driver without one (NUMA ids on older drivers)
leaves that field at its default and the rest is still reported.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from dsec.schemas.placement import GpuTopologyEvent

__all__ = ["NVLINK_MAX_LINKS", "read_topology"]

log = logging.getLogger(__name__)

NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
NVLINK_ACTIVE = 1  # NVML_FEATURE_ENABLED
# nvmlGpuTopologyLevel_t -> what placement calls it
_ANCESTOR = {0: "board", 10: "pcie_switch", 20: "pcie_multi", 30: "host_bridge", 40: "node",
             50: "system"}


def _read(function: Any, *args: Any) -> Any:
    try:
        return function(*args)
    except Exception:  # NVMLError_NotSupported and friends: that reading is left out
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_id(nvml: Any, handle: Any) -> str | None:
    info = _read(nvml.nvmlDeviceGetPciInfo, handle)
    return None if info is None else _text(info.busId).lower()


def _cpus(nvml: Any, handle: Any, cpu_count: int) -> list[int]:
    words = max(1, -(-cpu_count // 64))
    masks = _read(nvml.nvmlDeviceGetCpuAffinity, handle, words)
    if masks is None:
        return []
    return [word * 64 + bit for word, mask in enumerate(masks) for bit in range(64)
            if int(mask) >> bit & 1]


def _nvlink_peers(nvml: Any, handle: Any) -> tuple[set[str], int]:
    """The PCI bus ids an active NVLink of ``handle`` reaches, and how many are active."""
    peers: set[str] = set()
    active = 0
    for link in range(NVLINK_MAX_LINKS):
        state = _read(nvml.nvmlDeviceGetNvLinkState, handle, link)
        if state is None:
            break  # past the links this GPU has
        if state != NVLINK_ACTIVE:
            continue
        active += 1
        remote = _read(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        if remote is not None:
            peers.add(_text(remote.busId).lower())
    return peers, active


def read_topology(nvml: Any, node_id: str, cpu_count: int | None = None) -> list[
        GpuTopologyEvent]:
    """One event per GPU of this node; ``nvml`` is initialised by the caller."""
    cpu_count = cpu_count or os.cpu_count() or 1
    count = _read(nvml.nvmlDeviceGetCount) or 0
    devices = []
    for index in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        devices.append((index, handle, _text(nvml.nvmlDeviceGetUUID(handle)),
                        _text(_read(nvml.nvmlDeviceGetName, handle) or ""),
                        _bus_id(nvml, handle)))
    events = []
    for index, handle, uuid, model, _bus in devices:
        peers, active = _nvlink_peers(nvml, handle)
        links: dict[str, str] = {}
        for _other_index, other, other_uuid, _model, other_bus in devices:
            if other_uuid == uuid:
                continue
            if other_bus is not None and other_bus in peers:
                links[other_uuid] = "nvlink"
                continue
            level = _read(nvml.nvmlDeviceGetTopologyCommonAncestor, handle, other)
            if level is not None and int(level) in _ANCESTOR:
                links[other_uuid] = _ANCESTOR[int(level)]
        numa = _read(getattr(nvml, "nvmlDeviceGetNumaNodeId", lambda _h: None), handle)
        events.append(GpuTopologyEvent(
            node_id=node_id, gpu_uuid=uuid, gpu_model=model[:128], gpu_index=index,
            numa_node=int(numa) if numa is not None else -1,
            cpu_affinity=_cpus(nvml, handle, cpu_count), links=links, nvlink_active=active))
    return events

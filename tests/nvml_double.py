"""A test double of the pynvml functions the NVML sampler calls."""

from __future__ import annotations

from types import SimpleNamespace


class NvmlTestDouble:
    """Stands in for the ``pynvml`` functions the sampler calls: two GPUs, the second one
    without power readings, as some boards are. ``processes``: per GPU index, the compute
    processes on it as (pid, bytes it holds); ``used_bytes`` is each card's total."""

    class NVMLError(Exception):
        pass

    def __init__(self, processes: dict[int, list[tuple[int, int]]] | None = None,
                 used_bytes: list[int] | None = None) -> None:
        self.initialised = False
        self.shut_down = False
        self.used_bytes = used_bytes or [1 << 30, 2 << 30]
        self.processes = processes or {}
        self.throttle_reasons = [0x20, 0x20]  # SW thermal slowdown

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-0000000{handle}-aaaa-bbbb".encode()

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: int):
        return SimpleNamespace(used=self.used_bytes[handle], total=80 << 30, free=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used)
                for pid, used in self.processes.get(handle, [])]

    def nvmlDeviceGetUtilizationRates(self, handle: int):
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == 0
        return 71

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        assert clock == 1
        return 1755

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return self.throttle_reasons[handle]

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        if handle == 1:
            raise self.NVMLError("Not Supported")
        return 412_500  # mW

    # -- topology (ingest/gpu_topology.py): the two GPUs on one NVLink bridge of two active
    # links, GPU 0 on NUMA node 0 (CPUs 0-3, 64-65), GPU 1 on a driver without NUMA ids.
    nvlink_active = True
    common_ancestor = 50  # NVML_TOPOLOGY_SYSTEM, for when the NVLink is off

    def nvmlDeviceGetPciInfo(self, handle: int):
        return SimpleNamespace(busId=f"00000000:{0x17 + handle:02X}:00.0".encode())

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        if handle == 1:
            raise self.NVMLError("Not Supported")
        return 0

    def nvmlDeviceGetCpuAffinity(self, handle: int, cpu_set_size: int) -> list[int]:
        masks = [0b1111 << (4 * handle)] + [0] * (cpu_set_size - 1)
        if handle == 0 and cpu_set_size > 1:
            masks[1] = 0b11
        return masks

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if link >= 3:
            raise self.NVMLError("Invalid Argument")
        return int(self.nvlink_active and link < 2)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int):
        return self.nvmlDeviceGetPciInfo(1 - handle)

    def nvmlDeviceGetTopologyCommonAncestor(self, first: int, second: int) -> int:
        return self.common_ancestor

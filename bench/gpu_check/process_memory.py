"""This process's own GPU memory from NVML (``nvmlDeviceGetComputeRunningProcesses``)
against what torch's allocator holds (``torch.cuda.memory_reserved``).

NVML's figure for a process includes its CUDA context, which the allocator does not see,
so the check allocates ``STEP_BYTES`` more and compares the two growths: they must agree
within ``DELTA_TOLERANCE_BYTES``. A container's PID namespace can hide the process's own
PID from NVML (it lists host PIDs); the process is then found as the one whose NVML
figure grew by the allocation, and the figures say so.
"""

from __future__ import annotations

import os
import time
from typing import Any

from dsec.bench.gpu_check.outcome import Outcome

MIB = 1 << 20
STEP_BYTES = 1 << 30
DELTA_TOLERANCE_BYTES = 64 * MIB

ProcessTable = dict[tuple[int, int], int | None]  # (NVML device index, pid) -> bytes used


def find_own_process(before: ProcessTable, after: ProcessTable, pid: int,
                     grown_bytes: int) -> tuple[tuple[int, int] | None, str]:
    """(the NVML entry of this process, how it was found): by PID, else as the only entry
    whose use grew by about ``grown_bytes`` between the two tables."""
    mine = [key for key in after if key[1] == pid]
    if mine:
        return mine[0], "pid"
    grown = []
    for key, used in after.items():
        earlier = before.get(key)
        if used is not None and earlier is not None \
                and abs(used - earlier - grown_bytes) <= DELTA_TOLERANCE_BYTES:
            grown.append(key)
    if len(grown) == 1:
        return grown[0], "memory growth (this PID is not among NVML's: a PID namespace?)"
    return None, f"not found: {len(grown)} entries grew by the allocation, none has PID {pid}"


def _compute_processes(nvml: Any, handle: Any) -> list[Any]:
    error: Exception = RuntimeError("this NVML binding cannot list compute processes")
    for name in ("nvmlDeviceGetComputeRunningProcesses",
                 "nvmlDeviceGetComputeRunningProcesses_v2"):
        reader = getattr(nvml, name, None)
        if reader is None:
            continue
        try:
            return list(reader(handle))
        except nvml.NVMLError as exc:
            error = exc
    raise error


def process_table(nvml: Any) -> ProcessTable:
    table: ProcessTable = {}
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        for process in _compute_processes(nvml, handle):
            used = process.usedGpuMemory
            # NVML_VALUE_NOT_AVAILABLE arrives as None or as the all-ones sentinel
            table[(index, int(process.pid))] = None if used is None or used >= 2**63 \
                else int(used)
    return table


def check() -> Outcome:
    import pynvml
    import torch

    pynvml.nvmlInit()
    try:
        device = torch.cuda.current_device()
        held = [torch.empty(STEP_BYTES // 4, device=device)]
        torch.cuda.synchronize()
        reserved_before = torch.cuda.memory_reserved(device)
        before = process_table(pynvml)
        held.append(torch.empty(STEP_BYTES // 4, device=device))
        torch.cuda.synchronize()
        reserved_after = torch.cuda.memory_reserved(device)
        grown = reserved_after - reserved_before
        deadline_s = time.monotonic() + 5.0
        while True:  # NVML's per-process figure may trail the allocation
            after = process_table(pynvml)
            key, matched_by = find_own_process(before, after, os.getpid(), grown)
            if key is not None or time.monotonic() > deadline_s:
                break
            time.sleep(0.2)
    finally:
        pynvml.nvmlShutdown()
    figures: dict[str, Any] = {
        "pid": os.getpid(), "matched_by": matched_by,
        "nvml_pids": sorted({pid for _, pid in after}),
        "reserved_bytes": [reserved_before, reserved_after],
    }
    if not after:
        return Outcome("failed", "NVML lists no compute process on any GPU (inside a "
                                 "container without the host's PID namespace it lists none)",
                       figures)
    if key is None:
        return Outcome("failed", f"this process's NVML entry {matched_by}", figures)
    used_before, used_after = before.get(key), after[key]
    figures["nvml_used_bytes"] = [used_before, used_after]
    if used_before is None or used_after is None:
        return Outcome("failed", "NVML gives no memory figure for this process", figures)
    figures["context_bytes"] = used_before - reserved_before  # what the allocator cannot see
    figures["growth_bytes"] = {"nvml": used_after - used_before, "torch_reserved": grown}
    problems = []
    if abs((used_after - used_before) - grown) > DELTA_TOLERANCE_BYTES:
        problems.append("NVML's figure for this process did not grow with the allocator's")
    if used_before < reserved_before:
        problems.append("NVML gives this process less than the allocator holds")
    return Outcome.judged(problems, figures)

"""The probe's NVML readings against ``nvidia-smi``'s, GPU by GPU (matched by UUID).

Judged: the memory total (to the MiB), the memory in use (within ``USED_TOLERANCE_MIB`` of
a reading taken just before or after, since other processes allocate meanwhile) and the
temperature (within ``TEMPERATURE_TOLERANCE_C``). Clocks, power and utilisation move
between two readings; they are shown side by side, not judged.

Newer drivers give ``nvidia-smi`` the memory in use without what the driver reserves,
where NVML's first memory call (the probe's) counts it: when only that explains a gap,
the check says so and passes.
"""

from __future__ import annotations

import subprocess
from typing import Any

from dsec.bench.gpu_check.outcome import Outcome

MIB = 1 << 20
USED_TOLERANCE_MIB = 64
TEMPERATURE_TOLERANCE_C = 3.0
# the name last: it is the one field that could hold a comma
SMI_FIELDS = ("uuid", "memory.used", "memory.total", "temperature.gpu", "clocks.sm",
              "power.draw", "utilization.gpu", "name")


def parse_smi_csv(text: str) -> dict[str, dict[str, Any]]:
    """``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`` by UUID; a
    field the board does not report (``[N/A]``, ``[Not Supported]``) is None."""
    rows: dict[str, dict[str, Any]] = {}
    for line in text.strip().splitlines():
        cells = [cell.strip() for cell in line.split(",", len(SMI_FIELDS) - 1)]
        if len(cells) != len(SMI_FIELDS):
            continue
        row: dict[str, Any] = {}
        for name, cell in zip(SMI_FIELDS, cells, strict=True):
            if name in ("uuid", "name"):
                row[name] = cell
                continue
            try:
                row[name] = float(cell)
            except ValueError:
                row[name] = None
        rows[row["uuid"]] = row
    return rows


def compare_gpu(nvml_readings: list[dict[str, Any]], smi: dict[str, Any],
                reserved_bytes: int | None) -> tuple[list[str], dict[str, Any]]:
    """(problems, figures) for one GPU: its NVML samples taken around one ``nvidia-smi``
    reading, and the driver's reserved memory where NVML gives it."""
    problems: list[str] = []
    first = nvml_readings[0]
    uuid = first["gpu_uuid"]
    used_mib = [r["memory_used_bytes"] / MIB for r in nvml_readings]
    figures: dict[str, Any] = {
        "name": smi.get("name"),
        "memory_total_mib": {"nvml": first["memory_total_bytes"] / MIB,
                             "nvidia_smi": smi["memory.total"]},
        "memory_used_mib": {"nvml": used_mib, "nvidia_smi": smi["memory.used"]},
        "temperature_c": {"nvml": first.get("temperature_c"),
                          "nvidia_smi": smi["temperature.gpu"]},
        "sm_clock_mhz": {"nvml": first.get("sm_clock_mhz"), "nvidia_smi": smi["clocks.sm"]},
        "power_w": {"nvml": first.get("power_w"), "nvidia_smi": smi["power.draw"]},
        "utilisation_pct": {"nvml": first.get("utilisation_pct"),
                            "nvidia_smi": smi["utilization.gpu"]},
    }
    if smi["memory.total"] is None or abs(first["memory_total_bytes"] / MIB
                                          - smi["memory.total"]) > 1.0:
        problems.append(f"{uuid}: memory total differs")
    smi_used = smi["memory.used"]

    def within(offset_mib: float) -> bool:
        return smi_used is not None and (min(used_mib) - offset_mib - USED_TOLERANCE_MIB
                                         <= smi_used
                                         <= max(used_mib) - offset_mib + USED_TOLERANCE_MIB)

    if not within(0.0):
        reserved_mib = None if reserved_bytes is None else reserved_bytes / MIB
        if reserved_mib is not None and within(reserved_mib):
            figures["memory_used_note"] = (
                f"nvidia-smi leaves out the {reserved_mib:.0f} MiB the driver reserves; "
                "NVML's memory info (what the probe reports) counts it")
        else:
            problems.append(f"{uuid}: memory in use differs by more than "
                            f"{USED_TOLERANCE_MIB} MiB")
    nvml_c, smi_c = first.get("temperature_c"), smi["temperature.gpu"]
    if nvml_c is not None and smi_c is not None and abs(nvml_c - smi_c) > TEMPERATURE_TOLERANCE_C:
        problems.append(f"{uuid}: temperature differs by more than {TEMPERATURE_TOLERANCE_C} C")
    return problems, figures


class _Samples:
    def __init__(self) -> None:
        self.gpu: list[dict[str, Any]] = []

    def record_fields(self, kind: str, fields: dict[str, Any]) -> None:
        if kind == "gpu":
            self.gpu.append(fields)


def _reserved_bytes(uuid: str) -> int | None:
    try:
        import pynvml

        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).reserved)
    except Exception:  # older drivers and bindings have no v2 memory info
        return None


def check() -> Outcome:
    from dsec.ingest.nvml import NvmlSampler

    samples = _Samples()
    sampler = NvmlSampler(samples, interval_s=1.0)
    if not sampler.open():
        return Outcome("failed", f"the probe's NVML sampler did not open: "
                                 f"{sampler.unavailable_reason}")
    try:
        sampler.sample_once()
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=False)
        sampler.sample_once()
        reserved = {r["gpu_uuid"]: _reserved_bytes(r["gpu_uuid"]) for r in samples.gpu}
    finally:
        sampler.stop()
    if done.returncode != 0:
        return Outcome("failed", f"nvidia-smi exited with {done.returncode}: "
                                 f"{done.stderr.strip()[:300]}")
    smi = parse_smi_csv(done.stdout)
    by_uuid: dict[str, list[dict[str, Any]]] = {}
    for reading in samples.gpu:
        by_uuid.setdefault(reading["gpu_uuid"], []).append(reading)
    problems: list[str] = []
    figures: dict[str, Any] = {"gpus_nvml": len(by_uuid), "gpus_nvidia_smi": len(smi),
                               "per_gpu": {}}
    for uuid, readings in by_uuid.items():
        if uuid not in smi:
            problems.append(f"{uuid}: sampled by NVML, not listed by nvidia-smi")
            continue
        gpu_problems, gpu_figures = compare_gpu(readings, smi[uuid], reserved[uuid])
        problems += gpu_problems
        figures["per_gpu"][uuid] = gpu_figures
    if not figures["per_gpu"]:
        problems.append("no GPU seen by both NVML and nvidia-smi")
    return Outcome.judged(problems, figures)

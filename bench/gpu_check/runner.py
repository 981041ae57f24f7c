"""Runs the GPU checks, each in a child process with its own time limit.

A process of its own per check: a memory fraction, an NCCL communicator or a wedged
kernel stays inside the check that made it, and a check that hangs is killed (with the
ranks it started) when its time is up while the others still run. What a check needs
(CUDA through torch, NVML, ``nvidia-smi``) is looked up once here; a check whose need is
missing is skipped with the reason, so a host without a GPU answers in seconds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from dsec.bench.suite import last_json_object

PACKAGE = "dsec.bench.gpu_check"


@dataclass(frozen=True)
class CheckSpec:
    name: str
    target: str  # "module:function", the function taking no argument and returning an Outcome
    needs: frozenset[str]  # of "cuda", "nvml", "nvidia_smi"
    timeout_s: float


CHECKS = (
    CheckSpec("nvml_vs_nvidia_smi", f"{PACKAGE}.nvml_readings:check",
              frozenset({"nvml", "nvidia_smi"}), 45.0),
    CheckSpec("process_memory", f"{PACKAGE}.process_memory:check",
              frozenset({"cuda", "nvml"}), 60.0),
    CheckSpec("all_reduce_timing", f"{PACKAGE}.all_reduce_timing:check",
              frozenset({"cuda"}), 150.0),
    CheckSpec("memory_cap", f"{PACKAGE}.memory_cap:check", frozenset({"cuda"}), 60.0),
    CheckSpec("autocast_switching", f"{PACKAGE}.autocast_switching:check",
              frozenset({"cuda"}), 60.0),
    CheckSpec("snapshot_blocking", f"{PACKAGE}.snapshot_blocking:check",
              frozenset({"cuda"}), 90.0),
    CheckSpec("probe_overhead", f"{PACKAGE}.probe_overhead:check", frozenset({"cuda"}), 90.0),
)


@dataclass(frozen=True)
class GpuCheckOptions:
    checks: tuple[str, ...] | None = None  # None: every check
    total_timeout_s: float = 280.0  # the whole run stays under five minutes

    def chosen(self, specs: tuple[CheckSpec, ...]) -> tuple[CheckSpec, ...]:
        if self.checks is None:
            return specs
        unknown = set(self.checks) - {s.name for s in specs}
        if unknown:
            raise ValueError(f"unknown checks {sorted(unknown)}; "
                             f"known: {', '.join(s.name for s in specs)}")
        return tuple(s for s in specs if s.name in self.checks)


@dataclass(frozen=True)
class HostGpu:
    """What this host offers, and why not where it does not."""

    cuda: bool
    cuda_reason: str
    nvml: bool
    nvml_reason: str
    nvidia_smi: bool
    nvidia_smi_reason: str
    torch_version: str = ""
    torch_cuda_version: str | None = None
    device_count: int = 0
    device_names: tuple[str, ...] = ()

    def missing(self, needs: frozenset[str]) -> str:
        """Why a check with these needs cannot run here; empty when it can."""
        reasons = [getattr(self, f"{need}_reason") for need in sorted(needs)
                   if not getattr(self, need)]
        return "no GPU: " + "; ".join(reasons) if reasons else ""


def detect_host() -> HostGpu:
    smi = shutil.which("nvidia-smi")
    nvml, nvml_reason = False, ""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
        pynvml.nvmlShutdown()
        nvml = count > 0
        nvml_reason = "" if nvml else "NVML sees no device"
    except Exception as exc:
        nvml_reason = f"NVML unavailable ({type(exc).__name__}: {exc})"
    torch_version, torch_cuda, cuda, names = "", None, False, ()
    try:
        import torch

        torch_version, torch_cuda = torch.__version__, torch.version.cuda
        cuda = bool(torch.cuda.is_available())
        if cuda:
            names = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        cuda_reason = "" if cuda else (
            f"torch.cuda.is_available() is False (torch {torch_version}, "
            f"built for CUDA {torch_cuda})" if torch_cuda
            else f"torch {torch_version} is built without CUDA")
    except Exception as exc:
        cuda_reason = f"torch cannot be imported ({type(exc).__name__}: {exc})"
    return HostGpu(
        cuda=cuda, cuda_reason=cuda_reason, nvml=nvml, nvml_reason=nvml_reason,
        nvidia_smi=smi is not None,
        nvidia_smi_reason="" if smi else "nvidia-smi is not on PATH",
        torch_version=torch_version, torch_cuda_version=torch_cuda,
        device_count=len(names), device_names=names)


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the check and the ranks it started


def run_check(spec: CheckSpec, timeout_s: float) -> dict[str, Any]:
    """One check in a child process of its own (a session of its own, so the ranks it
    starts go with it when its time is up)."""
    started_s = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", f"{PACKAGE}.child", spec.target],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        process.communicate()
        return {"status": "failed", "reason": f"timed out after {timeout_s:.0f} s",
                "figures": {}, "wall_s": round(time.monotonic() - started_s, 2)}
    except BaseException:  # Ctrl-C: the check's session does not hear it
        _kill_group(process)
        raise
    result = last_json_object(stdout)
    if result is None:
        tail = stderr.strip().splitlines()[-6:]
        return {"status": "failed",
                "reason": f"the check's process exited with {process.returncode} "
                          "without an answer",
                "figures": {"stderr": tail}, "wall_s": round(time.monotonic() - started_s, 2)}
    return result


def run_gpu_checks(options: GpuCheckOptions, host: HostGpu | None = None,
                   specs: tuple[CheckSpec, ...] = CHECKS) -> dict[str, Any]:
    started_s = time.monotonic()
    chosen = options.chosen(specs)
    host = host if host is not None else detect_host()
    deadline_s = started_s + options.total_timeout_s
    checks: dict[str, Any] = {}
    for spec in chosen:
        missing = host.missing(spec.needs)
        left_s = deadline_s - time.monotonic()
        if missing:
            checks[spec.name] = {"status": "skipped", "reason": missing, "figures": {}}
        elif left_s < 5.0:
            checks[spec.name] = {"status": "skipped", "figures": {},
                                 "reason": f"the run's {options.total_timeout_s:.0f} s "
                                           "were spent"}
        else:
            checks[spec.name] = run_check(spec, min(spec.timeout_s, left_s))
    statuses = [c["status"] for c in checks.values()]
    return {
        "host": asdict(host),
        "checks": checks,
        "summary": {s: statuses.count(s) for s in ("ok", "failed", "skipped")},
        "wall_s": round(time.monotonic() - started_s, 1),
    }

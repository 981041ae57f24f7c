"""``dsec doctor --gpu``: checks that dsec's CUDA and NVML paths do what they claim on this
host, each in a process of its own with its own time limit, gathered into one JSON object."""

from dsec.bench.gpu_check.outcome import Outcome
from dsec.bench.gpu_check.runner import CHECKS, CheckSpec, GpuCheckOptions, run_gpu_checks

__all__ = ["CHECKS", "CheckSpec", "GpuCheckOptions", "Outcome", "run_gpu_checks"]

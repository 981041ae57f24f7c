"""``pynvml`` as the NVML test double (tests/nvml_double.py): a process started with this
folder first on its ``PYTHONPATH`` sees the double's two GPUs (this host has none)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nvml_double import NvmlTestDouble

_double = NvmlTestDouble()
NVMLError = NvmlTestDouble.NVMLError


def __getattr__(name: str):
    return getattr(_double, name)

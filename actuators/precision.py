"""Precision: the autocast dtype the training loop runs under, switched by the actuator."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from dsec.schemas.actuations import PrecisionParams

DTYPE_NAMES = ("bf16", "fp16", "fp32")


def default_device_type() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


class AutocastController:
    """``with controller():`` runs the forward pass under the current dtype; fp16 comes
    with a GradScaler (``backward``/``step`` use it), the others with a disabled one."""

    def __init__(self, device_type: str = "cpu", dtype: str = "fp32") -> None:
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {DTYPE_NAMES}")
        self.device_type = device_type
        self.dtype = dtype
        self.switches = 0
        self._scaler: Any = None

    def __call__(self) -> AbstractContextManager[Any]:
        import torch

        if self.dtype == "fp32":
            return torch.autocast(self.device_type, enabled=False)
        return torch.autocast(self.device_type, dtype=_torch_dtype(self.dtype))

    @property
    def scaler(self) -> Any:
        """The GradScaler for the current dtype (loss scaling only when fp16)."""
        import torch

        enabled = self.dtype == "fp16"
        if self._scaler is None or self._scaler.is_enabled() != enabled:
            self._scaler = torch.amp.GradScaler(self.device_type, enabled=enabled)
        return self._scaler

    def backward(self, loss: Any) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: Any) -> None:
        scaler = self.scaler
        scaler.step(optimizer)
        scaler.update()

    def apply(self, params: PrecisionParams) -> str:
        previous, self.dtype = self.dtype, params.dtype
        if previous != self.dtype:
            self.switches += 1
        scaling = " with loss scaling" if self.dtype == "fp16" else ""
        return f"autocast {previous} -> {self.dtype}{scaling}"

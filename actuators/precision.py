"""Precision: the autocast dtype the training loop runs under, switched by the actuator."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from dsec.actuators.effects import Effect, Pending
from dsec.actuators.loop_setting import LoopSetting
from dsec.schemas.actuations import PrecisionParams

DTYPE_NAMES = ("bf16", "fp16", "fp32")


def default_device_type() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _checked(dtype: str) -> str:
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {DTYPE_NAMES}")
    return dtype


class AutocastController(LoopSetting[str]):
    """``with controller():`` runs the forward pass under the requested dtype; fp16 comes
    with a GradScaler (``backward``/``step`` use it), the others with a disabled one. The
    dtype in force is the one the loop last entered."""

    what = "autocast"
    unattached = "the training loop has not run a forward pass under dsec.autocast()"
    attach_hint = "wrap the forward pass in `with dsec.autocast():`"

    def __init__(self, device_type: str = "cpu", dtype: str = "fp32") -> None:
        super().__init__(_checked(dtype))
        self.device_type = device_type
        self._scaler: Any = None

    @property
    def dtype(self) -> str:
        """The dtype the next forward pass runs under."""
        return self.requested

    def __call__(self, dtype: str | None = None) -> AbstractContextManager[Any]:
        """``dtype``: the loop's own precision (what an undo returns to); a command's
        dtype wins over it."""
        if dtype is not None and dtype != self.original:
            self.own(_checked(dtype))
        return self.autocast(self.requested)

    def autocast(self, dtype: str) -> AbstractContextManager[Any]:
        """Exactly ``dtype``, for a loop that decides it elsewhere (a data-parallel group
        agreeing on its members' most protective precision)."""
        return _Entered(self, _checked(dtype))

    @property
    def scaler(self) -> Any:
        """The GradScaler for the dtype of the last forward pass (loss scaling only when
        fp16)."""
        import torch

        enabled = (self.in_force or self.requested) == "fp16"
        if self._scaler is None or self._scaler.is_enabled() != enabled:
            self._scaler = torch.amp.GradScaler(self.device_type, enabled=enabled)
        return self._scaler

    def backward(self, loss: Any) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: Any) -> None:
        scaler = self.scaler
        scaler.step(optimizer)
        scaler.update()

    def apply(self, params: PrecisionParams) -> Effect | Pending:
        return self.request(params.dtype)

    def applied_detail(self, previous: str, target: str) -> str:
        scaling = " with loss scaling" if self.in_force == "fp16" else ""
        return super().applied_detail(previous, target) + scaling


class _Entered:
    """torch.autocast, recording the dtype in force once entered."""

    def __init__(self, controller: AutocastController, dtype: str) -> None:
        import torch

        self._controller = controller
        self._dtype = dtype
        self._inner = (torch.autocast(controller.device_type, enabled=False) if dtype == "fp32"
                       else torch.autocast(controller.device_type, dtype=_torch_dtype(dtype)))

    def __enter__(self) -> Any:
        entered = self._inner.__enter__()
        self._controller.take(self._dtype)
        return entered

    def __exit__(self, *exc: Any) -> Any:
        return self._inner.__exit__(*exc)

"""Precision without code: the program's own ``torch.autocast`` regions follow the actuator.

``torch.autocast.__enter__`` is wrapped (``torch.cuda.amp.autocast`` and the CPU one call
it too): each enabled region says which device and dtype the program asked for, and runs
under the dtype a precision command set, if any; a region the program disabled (a part
it keeps in fp32) stays disabled. A command is applied once a region has been entered
under it (read back from the region), so it is reported then. A program without an
autocast region cannot change precision without code: the command is unsupported, naming
the one line that adds it (``with dsec.autocast():`` around the forward pass). fp16 needs
loss scaling, which only the program can add: a switch to fp16 is unsupported unless the
program's own regions ask for fp16 (and so scale their loss already).
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the schemas load pydantic: not in every process ``dsec run`` starts
    from dsec.actuators.effects import Effect, Pending
    from dsec.schemas.actuations import PrecisionParams

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
AUTOCAST_LINE = "add `with dsec.autocast():` around the forward pass"
SCALING_LINE = "use `dsec.autocast()` with `dsec.controls().precision.scaler`"


class AutocastOverride:
    def __init__(self) -> None:
        self.dtype: str | None = None  # set by a command; None: as the program asks
        self.in_force: str | None = None  # what the last region entered ran under
        self.regions_entered = 0
        self.asked: dict[str, str] = {}  # device type -> dtype the program's regions ask for
        self._lock = threading.Lock()

    def install(self, autocast_class: Any) -> None:
        original = autocast_class.__enter__
        if getattr(original, "__dsec_override__", None) is not None:
            return
        override = self

        @functools.wraps(original)
        def __enter__(region: Any) -> Any:
            override.entered(region)
            return original(region)

        __enter__.__dsec_override__ = self  # type: ignore[attr-defined]
        autocast_class.__enter__ = __enter__

    def entered(self, region: Any) -> None:
        """Notes what ``region`` asks for, then points it at the commanded dtype."""
        import torch

        if not region._enabled:  # a region the program keeps at full precision stays so
            return
        if region.device not in self.asked:
            self.asked[region.device] = str(region.fast_dtype).removeprefix("torch.")
        dtype = self.dtype
        if dtype == "fp32":
            region._enabled = False
        elif dtype is not None:
            region.fast_dtype = getattr(torch, DTYPES[dtype])
        self.in_force = dtype or "as the program asks"
        self.regions_entered += 1

    def apply(self, params: PrecisionParams) -> Effect | Pending:
        """The precision applier of ``dsec run``: applied once a region ran under it."""
        from dsec.actuators.effects import Effect, Pending

        with self._lock:
            asked = ", ".join(f"{device} {dtype}" for device, dtype in sorted(self.asked.items()))
            if self.regions_entered == 0:
                return Effect.unsupported("precision", "the program enters no torch.autocast "
                                          "region", AUTOCAST_LINE, requested=params.dtype)
            if params.dtype == "fp16" and "float16" not in self.asked.values():
                return Effect.unsupported(
                    "precision", f"fp16 needs loss scaling the program does not do (its "
                    f"autocast asks for {asked})", SCALING_LINE, requested=params.dtype)
            previous, self.dtype = self.in_force, params.dtype
            entered_before = self.regions_entered

        def settle() -> Effect | None:
            if self.regions_entered == entered_before:
                return None  # no forward since: not in force yet
            return Effect.applied(f"the program's autocast regions ({asked}) run "
                                  f"{params.dtype} (were {previous})",
                                  requested=params.dtype, in_force=self.in_force)

        return Pending(settle)

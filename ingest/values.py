"""Reading recorded values: numbers, or one-element tensors. A CPU tensor is cheap to read
anywhere; a device tensor's read is a device sync, so only the flusher does it."""

from __future__ import annotations

import math
from typing import Any


def as_float(value: Any) -> float | None:
    """A number or a one-element tensor as a float (a device tensor is read: off the
    training thread only); None stays None."""
    if value is None:
        return None
    return float(value.item() if hasattr(value, "item") else value)


def finite_or_flag(value: Any) -> tuple[float | None, bool]:
    """(the value, False) when finite; (None, True) when NaN/Inf; (None, False) when None."""
    number = as_float(value)
    if number is None:
        return None, False
    if math.isfinite(number):
        return number, False
    return None, True


def host_value(value: Any) -> Any:
    """What a sample keeps of a value on the training thread: a one-element CPU tensor is
    read now (no device to wait for, and no tensor is kept alive until the flush); a device
    tensor is detached and kept, to be read by the flusher; anything else as it is."""
    if not hasattr(value, "detach"):
        return value
    if value.is_cpu and value.numel() == 1:
        return value.item()
    return value.detach()


def nonfinite(value: Any) -> bool:
    """True when ``value`` (a number or a tensor: any element) is NaN or Inf."""
    if hasattr(value, "isfinite") and value.numel() != 1:
        return not bool(value.isfinite().all())
    number = as_float(value)
    return number is not None and not math.isfinite(number)


def nonfinite_flags(values: list[Any]) -> list[bool]:
    """``nonfinite`` of each value. Device tensors of one shape on one device are read
    together: one stack and one device sync instead of one each. CPU tensors are read one
    by one: on the cold flusher thread a stack of a few dozen costs more."""
    if values and all(hasattr(value, "isfinite") and not value.is_cpu for value in values):
        import torch

        try:
            with torch.no_grad():
                stacked = torch.stack(values).reshape(len(values), -1)
                return (~torch.isfinite(stacked).all(dim=1)).tolist()
        except RuntimeError:  # shapes or devices differ
            pass
    return [nonfinite(value) for value in values]

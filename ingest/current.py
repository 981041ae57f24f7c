"""The probe of this process's ``dsec.init``, for integrations that find it by themselves."""

from __future__ import annotations

from typing import Any

_probe: Any = None


def set_current_probe(probe: Any) -> None:
    global _probe
    _probe = probe


def current_probe() -> Any:
    """The running probe, or None before ``dsec.init`` and after ``dsec.shutdown``."""
    return _probe

"""The probe of this process's ``dsec.init``, for integrations that find it by themselves.

Under ``dsec run`` there is no ``dsec.init``: the runtime starts when something first needs
it, and ``set_starter`` is how an integration here asks for it without knowing who starts it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_probe: Any = None
_starter: Callable[[], Any] | None = None


def set_current_probe(probe: Any) -> None:
    global _probe
    _probe = probe


def set_starter(starter: Callable[[], Any] | None) -> None:
    """``dsec run``: what starts this process's runtime (and so sets the probe) on first need."""
    global _starter
    _starter = starter


def current_probe() -> Any:
    """The running probe, or None before ``dsec.init`` and after ``dsec.shutdown`` (under
    ``dsec run``: started now if it is not yet)."""
    if _probe is None and _starter is not None:
        _starter()
    return _probe

"""Framework objects built with dsec's integration in them: ``add_to_every_instance`` wraps a
class's ``__init__`` (subclasses calling it included) so that each instance, once built, is
handed to ``attach`` (a Trainer gets dsec's callback, a veRL ``Tracking`` dsec's backend).
An ``attach`` that fails is logged once and the object stays as the framework built it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def add_to_every_instance(cls: Any, attach: Callable[[Any], Any]) -> None:
    original = cls.__init__
    if getattr(original, "__dsec_attach__", None) is not None:
        return
    failed: list[str] = []

    @functools.wraps(original)
    def __init__(instance: Any, *args: Any, **kwargs: Any) -> None:
        original(instance, *args, **kwargs)
        try:
            attach(instance)
        except Exception:  # the framework's object works without dsec's part
            if not failed:
                failed.append(cls.__name__)
                log.exception("dsec: could not add dsec to a %s", cls.__name__)

    __init__.__dsec_attach__ = attach  # type: ignore[attr-defined]
    cls.__init__ = __init__

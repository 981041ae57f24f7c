"""Framework objects built with dsec's integration in them, and the apply hooks that act
through a framework.

``add_to_every_instance`` wraps a class's ``__init__`` (subclasses calling it included) so
that each instance, once built, is handed to ``attach`` (a Trainer gets dsec's callback, a
veRL ``Tracking`` dsec's backend); an ``attach`` that fails is logged once and the object
stays as the framework built it. ``trainer_hooks`` are a transformers Trainer's: a snapshot
through its save path, applied once the checkpoint is on disk (failed if the save wrote
none); precision unsupported, as a Trainer's mixed precision is fixed when its accelerator
is built.
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


def trainer_hooks(callback: Any) -> dict[str, Callable[[Any], Any]]:
    """Apply hooks by action kind, acting through the Trainer ``callback`` reports."""
    from dsec.actuators.effects import Effect, Pending
    from dsec.schemas import ActuationStatus

    def snapshot(_params: Any) -> Pending:
        path = callback.request_save()

        def settle() -> Effect | None:
            if path in callback.saved:
                return Effect.applied(f"checkpoint through the Trainer's save path: {path}")
            if callback.save_requested_at is not None:
                return None  # the trainer saves at the end of this step
            return Effect(ActuationStatus.FAILED, f"the Trainer saved no checkpoint at {path}")

        return Pending(settle)

    def precision(params: Any) -> Effect:
        return Effect.unsupported(
            "precision", "a Trainer's mixed precision is fixed when its accelerator is built",
            "restart with bf16= or fp16= in the Trainer's arguments", requested=params.dtype)

    return {"snapshot": snapshot, "precision": precision}

"""What an apply hook reports: an ``Effect`` now, or a ``Pending`` one the training loop
settles at a later step boundary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dsec.schemas import ActuationStatus


def setting_text(value: object) -> str | None:
    """A setting as results carry it (``None`` stays None)."""
    return None if value is None else str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Effect:
    """The outcome of one command inside the worker, with the setting it asked for and the
    one the loop runs with, read back (None where the action has no lasting setting)."""

    status: ActuationStatus
    detail: str
    requested: str | None = None
    in_force: str | None = None

    @classmethod
    def applied(cls, detail: str, requested: object = None,
                in_force: object = None) -> Effect:
        return cls(ActuationStatus.APPLIED, detail, setting_text(requested),
                   setting_text(in_force))

    @classmethod
    def unsupported(cls, what: str, reason: str, attach: str, requested: object = None,
                    in_force: object = None) -> Effect:
        """``attach``: the one line of the training script that would carry it out."""
        return cls(ActuationStatus.UNSUPPORTED, f"{what} not in force: {reason}; {attach}",
                   setting_text(requested), setting_text(in_force))


@dataclass(frozen=True)
class Pending:
    """An effect the loop takes up later: ``settle`` is asked at each step boundary (on the
    training thread) until it returns the Effect. ``now``, when given, is reported at once
    (a ``deferred`` result, or an ``applied`` one whose effect is watched on); otherwise
    nothing is until it settles. ``settle`` may return another Pending: its ``now`` is
    reported, and its own ``settle`` is asked from then on (a cap that had to be lifted
    waits to be set again)."""

    settle: Callable[[], Effect | Pending | None]
    now: Effect | None = None


HookResult = str | Effect | Pending | None

"""What a command must pass before it is applied: signed, addressed here, fresh, new.

The signature is checked first: until it is, nothing in the command is trusted, so an
unverified command never reaches the replay memory and cannot hold back the genuine
command whose id it carries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from pydantic import ValidationError

from dsec.actuators.replay_memory import ReplayMemory
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    SignatureError,
    Verifier,
    WorkerIdentity,
)
from dsec.schemas.actuations import COMMAND_MAX_FUTURE_MS

AddressedTo = Callable[[WorkerIdentity], bool]
REPLAY_MEMORY_IDS = 65_536


def worker_target(identity: WorkerIdentity) -> AddressedTo:
    """Commands for one worker."""
    return lambda target: (target.node_id == identity.node_id
                           and target.worker_id == identity.worker_id
                           and target.job_id == identity.job_id)


def node_target(node_id: str) -> AddressedTo:
    """Commands for any worker of one node."""
    return lambda target: target.node_id == node_id


@dataclass(frozen=True)
class Rejection:
    status: ActuationStatus
    detail: str
    duplicate: bool = False  # already handled: nothing to apply and nothing to report again
    verified: bool = True  # False: the signature failed, so nothing in the command is its own
    addressed: bool = True  # False: a genuine command for someone else, nothing to report


class CommandGate:
    """Checks, in this order, signature, addressing, expiry and clock skew, then duplicates
    (idempotent by actuation id, remembered for verified commands only)."""

    def __init__(
        self, identity: WorkerIdentity | None, verifier: Verifier,
        remember: int = REPLAY_MEMORY_IDS, *, max_future_ms: int = COMMAND_MAX_FUTURE_MS,
        addressed: AddressedTo | None = None,
    ) -> None:
        """``addressed``: which targets are this gate's (default: ``identity``'s worker)."""
        if addressed is None:
            if identity is None:
                raise ValueError("a command gate needs an identity or an addressed predicate")
            addressed = worker_target(identity)
        if max_future_ms < 0:
            raise ValueError("max_future_ms must be >= 0")
        self._identity = identity
        self._addressed = addressed
        self._verifier = verifier
        self._max_future_ms = max_future_ms
        self._seen = ReplayMemory(remember, keep_after_expiry_ms=max_future_ms)
        self._lock = threading.Lock()

    def addressed_here(self, command: ActuationCommand) -> bool:
        """Whether the command names this gate's target (a cheap filter before ``check``;
        ``check`` asks again once the signature is verified)."""
        return self._addressed(command.target)

    def addresses(self, target: WorkerIdentity) -> bool:
        """Whether ``target`` is one of this gate's."""
        return self._addressed(target)

    def known(self, actuation_id: str) -> bool:
        """Whether a verified command with this id has passed the gate (and is remembered)."""
        with self._lock:
            return actuation_id in self._seen

    def reportable(self, command: ActuationCommand, rejection: Rejection) -> bool:
        """Whether a rejection is to be published: not for a command addressed elsewhere,
        nor for an unverified one carrying the id of a verified command (its rejection would
        land on the genuine command's record)."""
        if not rejection.addressed:
            return False
        return rejection.verified or not self.known(command.actuation_id)

    def check(self, command: ActuationCommand, now_ms: int) -> Rejection | None:
        """None when the command may be applied; never None twice for one actuation id."""
        try:
            self._verifier.verify(command)
        except SignatureError as exc:
            return Rejection(ActuationStatus.REJECTED, f"bad signature: {exc}", verified=False,
                             addressed=self._addressed(command.target))
        if not self._addressed(command.target):
            return Rejection(ActuationStatus.REJECTED, "not addressed here", addressed=False)
        if command.expires_at_ms <= now_ms:
            return Rejection(
                ActuationStatus.STALE, f"expired {now_ms - command.expires_at_ms} ms ago"
            )
        ahead_ms = command.event_time_ms - now_ms
        if ahead_ms > self._max_future_ms:
            return Rejection(
                ActuationStatus.REJECTED,
                f"dated {ahead_ms} ms ahead of this clock (at most {self._max_future_ms} ms)",
            )
        with self._lock:
            if command.actuation_id in self._seen:
                return Rejection(ActuationStatus.SUPERSEDED, "duplicate actuation id",
                                 duplicate=True)
            if not self._seen.remember(command.actuation_id, command.expires_at_ms, now_ms):
                return Rejection(
                    ActuationStatus.REJECTED,
                    f"replay memory full ({self._seen.capacity} unexpired commands): "
                    "not applied, so that none can be replayed",
                )
        return None


def out_of_bounds_result(value: bytes | None, reason: str) -> ActuationResult | None:
    """The rejection to report for a command that failed validation (e.g. a parameter out
    of bounds), when its envelope still names a target; None when it does not."""
    try:
        raw = orjson.loads(value or b"")
        target = WorkerIdentity.model_validate(raw["target"])
        actuation_id = str(raw["actuation_id"])[:64]
        action = raw.get("action")
        kind = str(action.get("kind", ""))[:32] if isinstance(action, dict) else ""
    except (orjson.JSONDecodeError, ValidationError, KeyError, TypeError):
        return None
    if not actuation_id:
        return None
    return ActuationResult(
        actuation_id=actuation_id, identity=target, action_kind=kind,
        status=ActuationStatus.REJECTED, detail=f"out of bounds: {reason}"[:2048],
    )

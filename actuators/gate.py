"""What a command must pass before it is applied: addressed here, signed, fresh, new."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import orjson
from pydantic import ValidationError

from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    SignatureError,
    WorkerIdentity,
    verify,
)


@dataclass(frozen=True)
class Rejection:
    status: ActuationStatus
    detail: str
    duplicate: bool = False  # already handled: nothing to apply and nothing to report again


class CommandGate:
    """Checks addressing, signature, expiry and duplicates (idempotent by actuation id)."""

    def __init__(
        self, identity: WorkerIdentity | None, signing_key: bytes, remember: int = 10_000
    ) -> None:
        self._identity = identity
        self._key = signing_key
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember

    def addressed_here(self, command: ActuationCommand) -> bool:
        """For a gate of one worker; a node's gate (no identity) checks the node itself."""
        if self._identity is None:
            return False
        target = command.target
        return (
            target.node_id == self._identity.node_id
            and target.worker_id == self._identity.worker_id
            and target.job_id == self._identity.job_id
        )

    def check(self, command: ActuationCommand, now_ms: int) -> Rejection | None:
        """None when the command may be applied; never None twice for one actuation id."""
        if command.actuation_id in self._seen:
            return Rejection(ActuationStatus.SUPERSEDED, "duplicate actuation id", duplicate=True)
        self._seen[command.actuation_id] = None
        if len(self._seen) > self._remember:
            self._seen.popitem(last=False)
        try:
            verify(command, self._key)
        except SignatureError as exc:
            return Rejection(ActuationStatus.REJECTED, f"bad signature: {exc}")
        if command.expires_at_ms <= now_ms:
            return Rejection(
                ActuationStatus.STALE, f"expired {now_ms - command.expires_at_ms} ms ago"
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

"""Actuation commands (policy engine → node actuator → worker) and their results.

Every parameter is bounded here, so an out-of-bounds command fails validation
wherever it is read, and never reaches an apply hook.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from dsec.schemas.base import EpochMs, Event, Identifier, Model, Version, WorkerIdentity

MIB = 1 << 20
GIB = 1 << 30

# An undo's value: back to the worker's own setting, whatever it ran before the first
# command (an fp32 worker downgraded to fp16 returns to fp32).
ORIGINAL = "original"
Original = Literal["original"]


class ActionKind(StrEnum):
    SNAPSHOT = "snapshot"
    MEMORY_CAP = "memory_cap"
    PRECISION = "precision"
    GRAD_COMPRESSION = "grad_compression"
    GRAD_ACCUMULATION = "grad_accumulation"
    SAMPLER = "sampler"
    SYNC_PRIORITY = "sync_priority"


class SnapshotParams(Model):
    kind: Literal[ActionKind.SNAPSHOT] = ActionKind.SNAPSHOT
    # zstd level for the snapshot's weights; None leaves the actuator's default.
    compression_level: Annotated[int, Field(ge=1, le=19)] | None = None


class MemoryCapParams(Model):
    kind: Literal[ActionKind.MEMORY_CAP] = ActionKind.MEMORY_CAP
    limit_bytes: Annotated[int, Field(ge=256 * MIB, le=1024 * GIB)]


class PrecisionParams(Model):
    kind: Literal[ActionKind.PRECISION] = ActionKind.PRECISION
    dtype: Literal["bf16", "fp16", "fp32"] | Original


class GradCompressionParams(Model):
    kind: Literal[ActionKind.GRAD_COMPRESSION] = ActionKind.GRAD_COMPRESSION
    bits: Literal[4, 8, 16, 32] | Original


class GradAccumulationParams(Model):
    kind: Literal[ActionKind.GRAD_ACCUMULATION] = ActionKind.GRAD_ACCUMULATION
    steps: Annotated[int, Field(ge=1, le=64)] | Original


class SamplerParams(Model):
    kind: Literal[ActionKind.SAMPLER] = ActionKind.SAMPLER
    paused: bool


class SyncPriorityParams(Model):
    kind: Literal[ActionKind.SYNC_PRIORITY] = ActionKind.SYNC_PRIORITY
    level: Annotated[int, Field(ge=-3, le=3)]


ActionParams = Annotated[
    SnapshotParams
    | MemoryCapParams
    | PrecisionParams
    | GradCompressionParams
    | GradAccumulationParams
    | SamplerParams
    | SyncPriorityParams,
    Field(discriminator="kind"),
]

ACTION_PARAM_MODELS: dict[ActionKind, type[Model]] = {
    ActionKind.SNAPSHOT: SnapshotParams,
    ActionKind.MEMORY_CAP: MemoryCapParams,
    ActionKind.PRECISION: PrecisionParams,
    ActionKind.GRAD_COMPRESSION: GradCompressionParams,
    ActionKind.GRAD_ACCUMULATION: GradAccumulationParams,
    ActionKind.SAMPLER: SamplerParams,
    ActionKind.SYNC_PRIORITY: SyncPriorityParams,
}

MAX_COMMAND_TTL_MS = 3_600_000
# How far ahead of an actuator's clock a command may be dated (the policy engine's clock
# skew); a command dated later is rejected.
COMMAND_MAX_FUTURE_MS = 60_000


class ActuationCommand(Event):
    """One action for one worker, keyed by node on the wire; idempotent by ``actuation_id``."""

    actuation_id: Annotated[str, Field(min_length=8, max_length=64)]
    target: WorkerIdentity
    expires_at_ms: EpochMs
    policy_name: Identifier
    policy_version: Version
    action: ActionParams
    reason: Annotated[str, Field(max_length=1024)] = ""
    signature: Annotated[str, Field(max_length=256)] | None = None

    @model_validator(mode="after")
    def _bounded_expiry(self) -> ActuationCommand:
        ttl_ms = self.expires_at_ms - self.event_time_ms
        if not 0 < ttl_ms <= MAX_COMMAND_TTL_MS:
            raise ValueError(
                f"expires_at_ms must be within {MAX_COMMAND_TTL_MS} ms after event_time_ms"
            )
        return self


class ActuationStatus(StrEnum):
    APPLIED = "applied"  # in force, and read back from the loop that uses it
    FAILED = "failed"
    REJECTED = "rejected"
    STALE = "stale"
    SUPERSEDED = "superseded"
    # the worker's loop does not use what would carry it out; the detail names the line
    # that attaches it
    UNSUPPORTED = "unsupported"
    # accepted, not yet in force (a memory cap below what the process holds): applied, and
    # reported again, once it can be without harm
    DEFERRED = "deferred"


SettingValue = Annotated[str, Field(max_length=64)]


class ActuationResult(Event):
    actuation_id: Annotated[str, Field(min_length=1, max_length=64)]
    identity: WorkerIdentity
    action_kind: Annotated[str, Field(max_length=32)]
    status: ActuationStatus
    detail: Annotated[str, Field(max_length=2048)] = ""
    command_time_ms: EpochMs | None = None
    # The setting the command asked for and the one the worker's loop runs with, read
    # back (they differ while a change waits, or where a data-parallel group agrees on
    # another); None where the action has no lasting setting or the worker did not say.
    requested: SettingValue | None = None
    in_force: SettingValue | None = None

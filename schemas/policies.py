"""Policies as data, and the audit record of every decision the engine takes."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from dsec.schemas.actuations import ActionParams
from dsec.schemas.base import Event, Identifier, Model, WorkerIdentity

Seconds = Annotated[float, Field(ge=0, le=30 * 86400)]


class PolicyAction(Model):
    params: ActionParams
    ttl_s: Annotated[float, Field(gt=0, le=3600)] = 60.0


class PolicySpec(Model):
    """A policy: a CEL condition over a target's features, and what to do when it holds."""

    name: Identifier
    version: Annotated[int, Field(ge=0)] = 1
    description: Annotated[str, Field(max_length=4096)] = ""
    condition: Annotated[str, Field(min_length=1, max_length=4096)]
    for_s: Seconds = 0.0
    cooldown_s: Seconds = 60.0
    priority: Annotated[int, Field(ge=0, le=1000)] = 100
    action: PolicyAction
    dry_run: bool = False
    signature: Annotated[str, Field(max_length=256)] | None = None


class DecisionKind(StrEnum):
    FIRED = "fired"
    SUPPRESSED_COOLDOWN = "suppressed_cooldown"
    DRY_RUN = "dry_run"
    POLICY_REJECTED = "policy_rejected"
    EVALUATION_ERROR = "evaluation_error"


class PolicyDecision(Event):
    policy_name: Identifier
    policy_version: Annotated[int, Field(ge=0)]
    identity: WorkerIdentity | None = None
    decision: DecisionKind
    actuation_id: Annotated[str, Field(max_length=64)] | None = None
    detail: Annotated[str, Field(max_length=2048)] = ""

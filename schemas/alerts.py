"""Alerts that reach people, and the health of GPUs as the policies judged it.

An ``AlertEvent`` is one change of a policy alert's state (it started firing, or it was
resolved), keyed by its fingerprint on the alerts topic; the latest per fingerprint is
the alert's state, as in Alertmanager. A ``GpuHealthEvent`` is one change of a GPU's
health, keyed by the GPU's UUID on a compacted topic, for placement to read.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from dsec.schemas.base import EpochMs, Event, Identifier, WorkerIdentity

LabelName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")]
LabelValue = Annotated[str, Field(max_length=512)]
Fingerprint = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]


class AlertStatus(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class AlertEvent(Event):
    """``labels`` identify the alert (``alertname``, ``policy``, ``job``, ``worker``, …) and
    ``fingerprint`` is their hash; a resolution carries the labels of the firing it ends.
    ``ends_at_ms`` is set once resolved."""

    fingerprint: Fingerprint
    status: AlertStatus
    alertname: Annotated[str, Field(min_length=1, max_length=256)]
    policy_name: Identifier
    policy_version: Annotated[int, Field(ge=0)]
    identity: WorkerIdentity | None = None
    labels: Annotated[dict[LabelName, LabelValue], Field(max_length=32)]
    annotations: Annotated[dict[LabelName, Annotated[str, Field(max_length=2048)]],
                           Field(max_length=16)] = Field(default_factory=dict)
    starts_at_ms: EpochMs
    ends_at_ms: EpochMs | None = None


GpuHealthState = Literal["degraded", "healthy"]


class GpuHealthEvent(Event):
    """A GPU entered ``state`` at ``since_ms``: why (the readings of the policy that judged
    it), by which ``signal`` (``thermal_throttle``, ``sync_latency_anomaly``, …), and on
    which worker's features it showed."""

    gpu_uuid: Identifier
    gpu_model: Annotated[str, Field(max_length=128)] = ""
    state: GpuHealthState
    since_ms: EpochMs
    signal: Annotated[str, Field(max_length=128)] = ""
    reason: Annotated[str, Field(max_length=2048)] = ""
    policy_name: Identifier
    identity: WorkerIdentity | None = None

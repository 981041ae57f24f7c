"""The fleet job's input: one worker's contribution to the fleet features of its pool, or of
its whole job, re-keyed so that a scope's workers meet in one partition."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dsec.schemas.base import Event, Identifier, WorkerIdentity
from dsec.schemas.features import FeatureName, fleet_identity

# The worker features the fleet job reads; the cumulative ones are differenced.
FLEET_INPUT_FEATURES = (
    "gpu_utilisation_pct", "worker_lost", "step_time_s_total", "grad_syncs_total",
    "grad_syncs_failed_total", "recoveries_total", "snapshot_recoveries_total",
    "snapshot_recovery_time_s_total",
)


class FleetInput(Event):
    """What one feature event or breaker trip of ``worker`` adds to ``scope`` (the worker's
    pool, or its whole job when ``pool`` is None). ``event_time_ms`` is the source's."""

    scope: Literal["pool", "job"]
    job_id: Identifier
    pool: Identifier | None = None
    worker: WorkerIdentity
    readings: Annotated[dict[FeatureName, float], Field(max_length=16)] = Field(
        default_factory=dict)
    breaker_trip: bool = False

    def scope_key(self) -> str:
        return scope_key(self.job_id, self.pool)


def scope_key(job_id: str, pool: str | None) -> str:
    """The Kafka key (and table key) of a scope: the job and its fleet identity's worker id."""
    return f"{job_id}|{fleet_identity(job_id, pool).worker_id}"

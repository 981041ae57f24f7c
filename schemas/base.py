"""Fields every event carries: schema version, unique id, event time, producer identity."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

SCHEMA_VERSION = 1

# Identifiers travel in Kafka keys and ClickHouse sort keys: short, printable.
Identifier = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:\-/]+$")]
EPOCH_MS_MAX = 32503680000000  # year 3000
EpochMs = Annotated[int, Field(ge=0, le=EPOCH_MS_MAX)]
# Integers are bounded by the columns that store them (and by what the JSON encoder writes):
# an event past them would decode here and then fail to encode or to be stored.
INT64_MAX = 2**63 - 1
UINT32_MAX = 2**32 - 1
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
Version = Annotated[int, Field(ge=0, le=UINT32_MAX)]  # policy versions: UInt32 columns
LabelKey = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
LabelValue = Annotated[str, Field(max_length=128)]
# Tags the stream jobs set themselves on feature events; a worker label may not take them.
RESERVED_LABELS = frozenset({"pool", "gpu_model", "episode_end_reason"})


def new_event_id() -> str:
    return uuid.uuid4().hex


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Model(BaseModel):
    """Strict, immutable wire model: unknown fields are errors, not silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Event(Model):
    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: Annotated[str, Field(min_length=8, max_length=64)] = Field(
        default_factory=new_event_id
    )
    event_time_ms: EpochMs = Field(default_factory=now_ms)


class WorkerIdentity(Model):
    """Who produced an event: the job, the training worker and the node it runs on, the
    resource pool it runs in (``dsec.init(pool=...)``, ``DSEC_POOL``) and its labels.

    ``pool`` and ``labels`` are None when not given, so that the canonical (signed) form
    of an identity without them is what it always was.
    """

    job_id: Identifier
    worker_id: Identifier
    node_id: Identifier
    pool: Identifier | None = None
    labels: Annotated[dict[LabelKey, LabelValue], Field(max_length=16)] | None = None

    @field_validator("labels")
    @classmethod
    def _not_reserved(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        taken = sorted(set(labels or ()) & RESERVED_LABELS)
        if taken:
            raise ValueError(f"reserved label names: {', '.join(taken)}")
        return labels

    def __hash__(self) -> int:
        # Identities key sets and maps; a frozen model holding a dict hashes by its items.
        labels = tuple(sorted(self.labels.items())) if self.labels else None
        return hash((self.job_id, self.worker_id, self.node_id, self.pool, labels))

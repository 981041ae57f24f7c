"""Feature events: what the stream jobs derive per worker (and per GPU)."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field, field_validator

from dsec.schemas.base import Event, Identifier, WorkerIdentity

FeatureName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]


class FeatureEvent(Event):
    identity: WorkerIdentity
    gpu_uuid: Identifier | None = None
    window: Annotated[str, Field(max_length=64)] = ""
    features: Annotated[dict[FeatureName, float], Field(max_length=256)]

    @field_validator("features")
    @classmethod
    def _finite(cls, features: dict[str, float]) -> dict[str, float]:
        bad = [name for name, value in features.items() if not math.isfinite(value)]
        if bad:
            raise ValueError(f"non-finite feature values: {', '.join(sorted(bad))}")
        return features

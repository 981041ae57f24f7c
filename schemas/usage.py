"""What the control plane itself costs: each dsec service process's CPU and memory."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from dsec.schemas.base import Event, Identifier


class ProcessUsage(Event):
    """One reading of a service process: CPU time since it started (user + system) and
    resident memory now. ``started_at_ms`` tells one process from the next of a service
    on the same host."""

    service: Annotated[str, Field(min_length=1, max_length=128)]
    host: Identifier
    pid: Annotated[int, Field(ge=0)]
    started_at_ms: Annotated[int, Field(ge=0)]
    cpu_s: Annotated[float, Field(ge=0)]
    rss_bytes: Annotated[int, Field(ge=0)]

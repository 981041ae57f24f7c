"""The HTTP ingest contract for runtimes that are not Python (agent platforms, services).

A runtime registers once, then posts metric samples; policies reach it by its webhook.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AnyHttpUrl, Field

from dsec.schemas.base import Identifier, Model, WorkerIdentity
from dsec.schemas.metrics import MetricSample


class RuntimeRegistration(Model):
    runtime_id: Identifier  # becomes the worker_id of its samples
    runtime_type: Annotated[str, Field(min_length=1, max_length=64)]
    concurrency: Annotated[int, Field(ge=1, le=1_000_000)]
    mean_call_latency_ms: Annotated[float, Field(ge=0)]
    function_calling: bool
    webhook_url: AnyHttpUrl | None = None
    job_id: Identifier | None = None  # default: the gateway's job
    node_id: Identifier = "external"
    pool: Identifier | None = None  # the resource pool it runs in

    def identity(self, default_job_id: str) -> WorkerIdentity:
        """Who the runtime is in events and commands; ``default_job_id``: the gateway's."""
        return WorkerIdentity(job_id=self.job_id or default_job_id, worker_id=self.runtime_id,
                              node_id=self.node_id, pool=self.pool)


class RuntimeMetricsPost(Model):
    """What a registered runtime posts: samples only; its identity comes from registration."""

    samples: Annotated[list[MetricSample], Field(min_length=1, max_length=10_000)]


class RegisteredRuntime(Model):
    """A registration as the gateway keeps it: with the SHA-256 of the runtime's own bearer
    token, or none once that token is revoked."""

    registration: RuntimeRegistration
    token_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None

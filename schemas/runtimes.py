"""The HTTP ingest contract for runtimes that are not Python (agent platforms, services).

A runtime registers once, then posts metric samples; policies reach it by its webhook.
The probes in endpoint mode (the Python probe's ``dsec.init(endpoint=...)`` and the C
library ``libdsec_inject.so``) are runtimes too: they post their batches as columns.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AnyHttpUrl, Field, ValidationInfo, field_validator

from dsec.schemas.base import Identifier, LabelKey, LabelValue, Model, WorkerIdentity
from dsec.schemas.metrics import MetricColumns, MetricSample


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
    labels: Annotated[dict[LabelKey, LabelValue], Field(max_length=16)] | None = None

    def identity(self, default_job_id: str) -> WorkerIdentity:
        """Who the runtime is in events and commands; ``default_job_id``: the gateway's."""
        return WorkerIdentity(job_id=self.job_id or default_job_id, worker_id=self.runtime_id,
                              node_id=self.node_id, pool=self.pool, labels=self.labels)


class RuntimeMetricsPost(Model):
    """What a registered runtime posts: samples as rows, as columns (the probes' form), or
    both, at least one in all; its identity comes from registration.

    ``batch_id`` names the batch for retries: a batch posted twice under one id (an answer
    lost on the way back) becomes one message id, which the stream jobs and the sink count
    once.
    """

    columns: MetricColumns | None = None
    batch_id: Annotated[str, Field(min_length=8, max_length=64,
                                   pattern=r"^[A-Za-z0-9_.:\-]+$")] | None = None
    samples: Annotated[list[MetricSample], Field(max_length=10_000, validate_default=True)] = []

    @field_validator("samples")
    @classmethod
    def _some_sample(cls, samples: list, info: ValidationInfo) -> list:
        columns = info.data.get("columns")
        if not samples and (columns is None or len(columns) == 0):
            raise ValueError("at least one sample, as a row in samples or in columns")
        return samples


class RegisteredRuntime(Model):
    """A registration as the gateway keeps it: with the SHA-256 of the runtime's own bearer
    token, or none once that token is revoked."""

    registration: RuntimeRegistration
    token_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None

"""The dsec plugin entry: what ``dsec run``, a ``dsec.yaml`` or a framework's plugin list
says about the instrumented process, and the environment it travels in.

The environment is the one channel to the instrumented process (and to the processes it
starts, torchrun's ranks among them): each field becomes the ``DSEC_*`` variable the
probe already reads. An ``endpoint`` is a Kafka bootstrap (``kafka://host:9092`` or
``host:9092``) or the ingest gateway's URL (``http://dsec-control-plane:8080``: endpoint
mode, for workers that cannot reach Kafka; its token stays in ``DSEC_ENDPOINT_TOKEN``,
out of config files).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from dsec.schemas.base import Identifier, Model
from dsec.zerotouch.appliers import SKIP_NONFINITE_ENV, SNAPSHOTS_ENV

ENDPOINT_ENV = "DSEC_ENDPOINT"


class ZeroTouchConfig(Model):
    endpoint: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    heartbeat_interval_s: Annotated[float, Field(gt=0, le=3600)] | None = None
    sandbox_id: Identifier | None = None
    worker_id: Identifier | None = None
    job_id: Identifier | None = None
    node_id: Identifier | None = None
    # a snapshot command saves the optimizers' parameters and state (see optimizers.py)
    snapshots: bool = True
    # an optimizer step whose gradients hold a NaN or an Inf is skipped (the step guard)
    skip_nonfinite_steps: bool = False

    @field_validator("endpoint")
    @classmethod
    def _known_scheme(cls, endpoint: str | None) -> str | None:
        if endpoint is not None and "://" in endpoint and not endpoint.startswith(
                ("kafka://", "http://", "https://")):
            raise ValueError("endpoint: kafka://host:port, host:port or http(s)://host:port")
        return endpoint

    @property
    def http_endpoint(self) -> str | None:
        if self.endpoint and self.endpoint.startswith(("http://", "https://")):
            return self.endpoint
        return None

    @property
    def bootstrap(self) -> str | None:
        if not self.endpoint or self.http_endpoint:
            return None
        return self.endpoint.removeprefix("kafka://")

    def merged(self, override: ZeroTouchConfig) -> ZeroTouchConfig:
        """This configuration with the fields ``override`` sets (command-line options over
        a file's entry)."""
        return self.model_copy(update=override.model_dump(exclude_unset=True))

    def environment(self) -> dict[str, str]:
        """The ``DSEC_*`` variables that carry this configuration."""
        env = {
            "DSEC_BOOTSTRAP": self.bootstrap,
            ENDPOINT_ENV: self.http_endpoint,
            "DSEC_PROBE_HEARTBEAT_INTERVAL_S": (None if self.heartbeat_interval_s is None
                                                else repr(self.heartbeat_interval_s)),
            "DSEC_SANDBOX_ID": self.sandbox_id,
            "DSEC_WORKER_ID": self.worker_id,
            "DSEC_JOB_ID": self.job_id,
            "DSEC_NODE_ID": self.node_id,
            SNAPSHOTS_ENV: None if self.snapshots else "0",
            SKIP_NONFINITE_ENV: "1" if self.skip_nonfinite_steps else None,
        }
        return {name: value for name, value in env.items() if value is not None}

"""Probe configuration: argument, then ``DSEC_*`` environment, then default; validated once."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProbeConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DSEC_PROBE_", frozen=True, extra="forbid")

    flush_interval_s: float = Field(default=0.1, gt=0, le=60)
    heartbeat_interval_s: float = Field(default=5.0, gt=0, le=3600)
    buffer_max_samples: int = Field(default=100_000, ge=1)
    grad_norm_every_n_steps: int = Field(default=1, ge=1)
    message_timeout_s: float = Field(default=300.0, gt=0)
    shutdown_flush_timeout_s: float = Field(default=10.0, ge=0)

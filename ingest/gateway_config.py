"""Ingest gateway configuration: argument, then ``DSEC_GATEWAY_*`` environment, then default."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewayConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DSEC_GATEWAY_", frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    token: SecretStr  # bearer token every runtime presents
    max_body_bytes: int = Field(default=4 << 20, ge=1024)
    publish_timeout_s: float = Field(default=30.0, gt=0)
    webhook_timeout_s: float = Field(default=5.0, gt=0)

"""Ingest gateway configuration: argument, then ``DSEC_GATEWAY_*`` environment, then default."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from dsec.infra.webhook_targets import parse_networks


class GatewayConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DSEC_GATEWAY_", frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    # enrols new runtimes (each gets a token of its own) and reads registrations
    token: SecretStr
    # revokes and reissues runtime tokens; without it only a runtime revokes its own
    admin_token: SecretStr | None = None
    max_body_bytes: int = Field(default=4 << 20, ge=1024)
    max_json_depth: int = Field(default=32, ge=2, le=512)
    # a request's headers, and then its body, must arrive within these
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=10.0, gt=0)
    keep_alive_timeout_s: float = Field(default=5.0, gt=0)
    max_connections: int = Field(default=1000, ge=1)  # past it, requests get 503
    # per runtime: sustained requests a second, and the burst above it
    rate_per_s: float = Field(default=20.0, gt=0)
    rate_burst: int = Field(default=40, ge=1)
    publish_timeout_s: float = Field(default=30.0, gt=0)
    webhook_timeout_s: float = Field(default=5.0, gt=0)
    # runtimes that poll for their commands: the longest a poll is held open, and how
    # many commands wait for one runtime before the next is refused
    max_poll_wait_s: float = Field(default=30.0, ge=0, le=300)
    poll_queue_max_commands: int = Field(default=64, ge=1)
    # private networks webhooks may point into (CIDR); public addresses are always allowed
    webhook_allowed_networks: tuple[str, ...] = ()
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _networks_parse(cls, networks: tuple[str, ...]) -> tuple[str, ...]:
        parse_networks(networks)
        return networks

    @model_validator(mode="after")
    def _tls_pair(self) -> GatewayConfig:
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("TLS needs both tls_certfile and tls_keyfile")
        return self

"""Configuration shared by every dsec service: argument, then ``DSEC_*`` environment, then default.

Resolved once, validated, frozen.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from dsec.schemas.actuations import COMMAND_MAX_FUTURE_MS
from dsec.schemas.event_times import EventTimeWindow
from dsec.schemas.units import ms_to_s, s_to_ms

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]


class DsecSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DSEC_", frozen=True, extra="forbid")

    bootstrap: str = "127.0.0.1:9092"
    # Endpoint mode, for workers that cannot reach Kafka: the probe posts to the ingest
    # gateway at this URL (http(s)://host:port) instead, presenting endpoint_token (the
    # gateway's enrolment token, or this worker's own runtime token).
    endpoint: str | None = None
    endpoint_token: SecretStr | None = None
    topic_prefix: str = Field(default="dsec", pattern=r"^[A-Za-z0-9_.\-]+$")
    job_id: str = "default"
    # The resource pool this process's workers run in (DSEC_POOL), and their labels
    # (DSEC_LABELS as JSON): both travel in the worker's identity, for policy selectors
    # and the pool's parameter overrides.
    pool: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:\-/]{1,128}$")
    labels: dict[str, str] = Field(default_factory=dict)
    # Of the topics dsec creates: `dsec init`'s and the stream jobs' table changelogs.
    replication_factor: int = Field(default=1, ge=1, le=16)
    # this machine's name for the node actuator and the workers on it (default: hostname;
    # in Kubernetes give it the node's name, not the pod's)
    node_id: str | None = None
    data_dir: Path = Path(".dsec")
    clickhouse_dsn: str | None = None
    clickhouse_ttl_days: int = Field(default=30, ge=1, le=3650)
    # How far ahead of this clock a sample's time may be (a worker's clock skew); later
    # samples, and those older than the TTL, are dead-lettered rather than stored.
    event_time_max_future_s: float = Field(default=300.0, gt=0, le=86400)
    # How commands and policies are signed: "ed25519" (a private key per role, verifiers
    # hold a trust list of public keys) or "hmac-dev" (one shared key, DSEC_SIGNING_KEY or
    # one made in the data folder; for development only: whoever verifies can also sign).
    signing_mode: Literal["ed25519", "hmac-dev"] = "ed25519"
    signing_key: SecretStr | None = None  # the hmac-dev mode's shared key
    # Private keys, one PEM file a role (<role>.pem), of the roles this process signs as
    # (default: <data_dir>/keys, where the first process to need one makes a keypair per
    # role and a trust list of them).
    keys_dir: Path | None = None
    # The public keys verifiers accept, JSON or YAML (default: <keys_dir>/trust.json);
    # re-read whenever the file changes.
    trust_list: Path | None = None
    # How far ahead of an actuator's clock a signed command may be dated; one dated later
    # is rejected with the reason, not applied.
    command_max_future_s: float = Field(default=ms_to_s(COMMAND_MAX_FUTURE_MS), gt=0, le=3600)
    # where node actuators put their sockets; owner-only (default: <tmp>/dsec-<uid>)
    run_dir: Path | None = None
    # how a worker receives commands: "node" (the node actuator's socket), "kafka" (its own
    # consumer, no daemon), or "auto" (the socket when a node actuator is listening)
    actuator_channel: Literal["auto", "node", "kafka"] = "auto"
    snapshot_dir: str | None = None  # a path or file:// URL (default: <data_dir>/snapshots)
    # Built-in policy parameter overrides, e.g. {"bandwidth-latency-breaker":
    # {"latency_cap_ms": 70}} (DSEC_POLICY_PARAMS as JSON).
    policy_params: dict[str, dict[str, float]] = Field(default_factory=dict)
    # Each service process serves /metrics and /healthz here (0: not served). `dsec up`
    # running the sink in a child process gives the child metrics_port + 1.
    metrics_port: int = Field(default=9464, ge=0, le=65534)
    metrics_host: str = "127.0.0.1"
    # Run every built-in policy in dry run (shadow mode): decisions are audited, nothing
    # is commanded (DSEC_POLICY_DRY_RUN=1).
    policy_dry_run: bool = False
    # Bounds on every policy, checked at publish and at load: a condition nested deeper or
    # costing more operations (operators, calls and operands) per target is rejected.
    policy_condition_max_depth: int = Field(default=24, ge=1, le=64)
    policy_condition_max_cost: int = Field(default=256, ge=1, le=4096)
    # No policy fires again sooner than this after it fired for a target, whatever its
    # own cooldown_s says.
    policy_cooldown_floor_s: float = Field(default=10.0, ge=0, le=86400)
    # Commands the engine sends one worker in any 60 s of event time; one beyond the cap
    # is not sent, and is audited as suppressed_rate_limit.
    commands_per_worker_per_min: int = Field(default=30, ge=1, le=10000)
    # How long the broker waits for a silent Faust worker (a killed process) before it
    # hands that worker's partitions to the others; within the broker's group bounds.
    stream_session_timeout_s: float = Field(default=60.0, ge=6.0, le=300.0)
    # The services' log level (DSEC_LOG_LEVEL=INFO shows Faust's rebalances and recoveries).
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    # The fleet features' window (trips and interruptions are counted in it: shorten it to
    # compress the hour) and how often each pool's and job's features are published.
    fleet_window_s: float = Field(default=3600.0, ge=1.0, le=7 * 86400)
    fleet_publish_interval_s: float = Field(default=10.0, ge=0.1, le=3600)
    # Where the alert notifier posts alerts, in Alertmanager's webhook format
    # (DSEC_ALERT_WEBHOOK_URLS as a JSON list), and how long it waits for each; a refused
    # post is tried again alert_webhook_attempts times in all, then dead-lettered.
    alert_webhook_urls: list[str] = Field(default_factory=list)
    alert_webhook_timeout_s: float = Field(default=5.0, gt=0, le=120)
    alert_webhook_attempts: int = Field(default=3, ge=1, le=20)
    # Net allocations of container objects between two of Python's youngest-generation
    # collections in a service process (CPython's default: 700, which costs the stream
    # jobs about a fifth of their CPU; docs/operations.md). 0 keeps the interpreter's.
    gc_young_objects: int = Field(default=50_000, ge=0, le=10_000_000)
    # How often each service process publishes its own CPU time and memory (0: never).
    usage_report_interval_s: float = Field(default=30.0, ge=0, le=3600)
    # `dsec report cost`: prices per GPU-hour, per CPU core-hour and per GiB-hour of memory
    # (one currency), and the probe's share of a training step's time as measured by the
    # probe-overhead benchmark (docs/benchmarks.md).
    cost_gpu_hour: float = Field(default=2.5, ge=0)
    cost_cpu_core_hour: float = Field(default=0.04, ge=0)
    cost_memory_gib_hour: float = Field(default=0.005, ge=0)
    probe_overhead_ratio: float = Field(default=0.004, ge=0, le=1)

    kafka_security_protocol: SecurityProtocol = "PLAINTEXT"
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: str | None = None
    kafka_ssl_certificate_location: str | None = None
    kafka_ssl_key_location: str | None = None

    @model_validator(mode="after")
    def _one_signing_mode(self) -> DsecSettings:
        if self.signing_key is not None and self.signing_mode != "hmac-dev":
            raise ValueError("DSEC_SIGNING_KEY is the shared key of DSEC_SIGNING_MODE=hmac-dev "
                             "(development only); Ed25519 keys are files in DSEC_KEYS_DIR")
        return self

    def clickhouse_target(self) -> str:
        """The DSN given, or the embedded chDB store in the data folder."""
        if self.clickhouse_dsn:
            return self.clickhouse_dsn
        return f"chdb://{(self.data_dir / 'clickhouse').resolve()}"

    def event_time_window(self) -> EventTimeWindow:
        """The sample times the store keeps, for the decoders of the stream jobs and sink."""
        return EventTimeWindow(ttl_days=self.clickhouse_ttl_days,
                               max_future_s=self.event_time_max_future_s)

    def health_url(self) -> str:
        """Where this configuration's service answers ``/healthz`` (loopback for 0.0.0.0)."""
        host = "127.0.0.1" if self.metrics_host in ("", "0.0.0.0", "::") else self.metrics_host
        return f"http://{host}:{self.metrics_port}/healthz"

    def command_max_future_ms(self) -> int:
        return s_to_ms(self.command_max_future_s)

    def run_directory(self) -> Path:
        if self.run_dir is not None:
            return self.run_dir
        return Path(tempfile.gettempdir()) / f"dsec-{os.getuid()}"

    def snapshot_location(self) -> str:
        return self.snapshot_dir or str(self.data_dir / "snapshots")

    def keys_directory(self) -> Path:
        return self.keys_dir if self.keys_dir is not None else self.data_dir / "keys"

    def trust_list_path(self) -> Path:
        return self.trust_list if self.trust_list is not None else (
            self.keys_directory() / "trust.json")

    def signing_key_bytes(self) -> bytes:
        """The hmac-dev mode's shared key: the one configured, else this installation's in
        the data folder (made once)."""
        if self.signing_key is not None:
            return self.signing_key.get_secret_value().encode()
        key_path = self.data_dir / "signing.key"
        if not key_path.exists():
            key_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32))
        return key_path.read_text().strip().encode()

    def kafka_security(self) -> dict[str, str]:
        """librdkafka security settings, passed through unchanged."""
        config: dict[str, str] = {"security.protocol": self.kafka_security_protocol}
        optional = {
            "sasl.mechanism": self.kafka_sasl_mechanism,
            "sasl.username": self.kafka_sasl_username,
            "sasl.password": (
                self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password else None
            ),
            "ssl.ca.location": self.kafka_ssl_ca_location,
            "ssl.certificate.location": self.kafka_ssl_certificate_location,
            "ssl.key.location": self.kafka_ssl_key_location,
        }
        config.update({k: v for k, v in optional.items() if v})
        return config

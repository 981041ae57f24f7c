"""Probe configuration: argument, then `DSEC_PROBE_*` environment, then default; validated once."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProbeConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DSEC_PROBE_", frozen=True, extra="forbid")

    # One message per flush. A sample with a NaN/Inf number in it is sent at once, not at
    # the next flush. Every flush costs the training process a cold wake of the flusher
    # (the encoding, the Kafka client, the GIL), so fewer flushes cost less; docs/benchmarks.md
    # has the figures of ``dsec bench probe-overhead``.
    flush_interval_s: float = Field(default=0.25, gt=0, le=60)
    heartbeat_interval_s: float = Field(default=5.0, gt=0, le=3600)
    buffer_max_samples: int = Field(default=100_000, ge=1)
    # One Kafka message stays well under the broker's 1 MB default after a long outage.
    max_samples_per_message: int = Field(default=2_000, ge=1, le=100_000)
    # Python run on the training thread after a step meets cold caches, so a step sample and
    # a gradient norm cost more than their own time. Each is taken every N steps when set;
    # by default (None) spaced so that the time it is timed for stays within its budget
    # fraction of the training time, measured as it goes (every 10th step until it knows),
    # and at least every max_interval steps. The time around the work is not all of its
    # cost (the steps after it run slower too), hence budgets well under the overhead
    # target; docs/benchmarks.md has the figures.
    step_sample_every_n_steps: int | None = Field(default=None, ge=1)
    step_sample_budget_fraction: float = Field(default=0.0002, gt=0, le=1)
    step_sample_max_interval_steps: int = Field(default=100, ge=1)
    # The probe's own gradient norm, when the trainer does not hand over its clipping norm.
    grad_norm_every_n_steps: int | None = Field(default=None, ge=1)
    grad_norm_budget_fraction: float = Field(default=0.0001, gt=0, le=1)
    grad_norm_max_interval_steps: int = Field(default=1000, ge=1)
    # Also check the loss of every step between samples for NaN/Inf (the flusher reads them;
    # a bad one becomes a sample of its own). Off by default: reading every loss costs about
    # as much as the rest of the probe on a 2 ms step, and a NaN that reaches the weights
    # shows in every later loss, so the next sample reports it anyway. What it adds is a NaN
    # the trainer skipped on its own (as AMP's GradScaler does).
    loss_check_every_step: bool = False
    message_timeout_s: float = Field(default=300.0, gt=0)
    shutdown_flush_timeout_s: float = Field(default=10.0, ge=0)
    # Local queue of the Kafka client (or of the HTTP transport in endpoint mode), in
    # messages (one message is one flush).
    transport_queue_max_messages: int = Field(default=10_000, ge=1)
    # Endpoint mode: how long one request to the ingest gateway may take.
    endpoint_request_timeout_s: float = Field(default=10.0, gt=0, le=300)
    grad_sync_timing: bool = True
    cuda_memory_interval_s: float = Field(default=1.0, ge=0)  # 0: off
    gpu_sample_interval_s: float = Field(default=1.0, ge=0)  # NVML; 0: off
    gpu_indices: tuple[int, ...] | None = None  # NVML device indices; None: every GPU

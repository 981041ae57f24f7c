"""Probe configuration: argument, then `DSEC_PROBE_*` environment, then default; validated once."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProbeConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DSEC_PROBE_", frozen=True, extra="forbid")

    flush_interval_s: float = Field(default=0.1, gt=0, le=60)
    heartbeat_interval_s: float = Field(default=5.0, gt=0, le=3600)
    buffer_max_samples: int = Field(default=100_000, ge=1)
    # One Kafka message stays well under the broker's 1 MB default after a long outage.
    max_samples_per_message: int = Field(default=2_000, ge=1, le=100_000)
    # Any Python run after an optimizer step meets cold caches (~10 us); on a 2 ms step, a
    # sample every step would cost ~2 %; every 10th step (the default) pays it a tenth as often;
    # the other steps are only counted. Set to 1 for every step.
    step_sample_every_n_steps: int = Field(default=10, ge=1)
    # The probe's own gradient norm (when the trainer does not hand over its clipping norm):
    # every N steps when set; by default (None) spaced so that the norms cost at most
    # grad_norm_budget_fraction of the training time, measured as it goes (every 10th step
    # until it knows), at least every grad_norm_max_interval_steps steps. A fused norm just
    # after backward takes 150-400 us on one CPU thread, so a 3 ms CPU step gets one every
    # ~50 steps and a GPU step of tens of milliseconds one every step or two.
    grad_norm_every_n_steps: int | None = Field(default=None, ge=1)
    grad_norm_budget_fraction: float = Field(default=0.002, gt=0, le=1)
    grad_norm_max_interval_steps: int = Field(default=100, ge=1)
    message_timeout_s: float = Field(default=300.0, gt=0)
    shutdown_flush_timeout_s: float = Field(default=10.0, ge=0)
    # Local queue of the Kafka client, in messages (one message is one flush).
    transport_queue_max_messages: int = Field(default=10_000, ge=1)
    grad_sync_timing: bool = True
    cuda_memory_interval_s: float = Field(default=1.0, ge=0)  # 0: off
    gpu_sample_interval_s: float = Field(default=1.0, ge=0)  # NVML; 0: off
    gpu_indices: tuple[int, ...] | None = None  # NVML device indices; None: every GPU

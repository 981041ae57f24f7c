"""Metric events published by the probes inside training workers.

One Kafka message per worker per flush interval: a ``MetricBatch`` carries the
producer's identity once and many samples, so that the message rate stays low
while the sample rate is high.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dsec.schemas.base import EpochMs, Event, Identifier, Model, WorkerIdentity, new_event_id

FiniteOrNone = float | None  # non-finite values travel as None with a flag beside them
NonNegativeInt = Annotated[int, Field(ge=0)]


class _Sample(Model):
    event_id: Annotated[str, Field(min_length=8, max_length=64)] = Field(
        default_factory=new_event_id
    )
    event_time_ms: EpochMs


class HeartbeatSample(_Sample):
    kind: Literal["heartbeat"] = "heartbeat"
    interval_s: Annotated[float, Field(gt=0, le=3600)]
    step: NonNegativeInt = 0
    samples_sent: NonNegativeInt = 0
    samples_buffered: NonNegativeInt = 0
    samples_dropped: NonNegativeInt = 0
    # Since the probe started; recorded == sent + buffered + dropped at any moment.
    samples_recorded: NonNegativeInt = 0
    messages_failed: NonNegativeInt = 0


class StepSample(_Sample):
    kind: Literal["step"] = "step"
    step: NonNegativeInt
    loss: FiniteOrNone = None
    grad_norm: Annotated[float, Field(ge=0)] | None = None
    loss_nonfinite: bool = False
    grad_nonfinite: bool = False
    step_time_ms: Annotated[float, Field(ge=0)] | None = None
    # "probe": computed by the probe; "trainer": the norm the trainer already had (clipping).
    grad_norm_source: Literal["probe", "trainer"] | None = None


class EpisodeSample(_Sample):
    kind: Literal["episode"] = "episode"
    episode_index: NonNegativeInt
    reward: float
    length: NonNegativeInt
    terminated: bool = True
    truncated: bool = False
    termination_reason: Annotated[str, Field(max_length=256)] | None = None


class GpuSample(_Sample):
    kind: Literal["gpu"] = "gpu"
    gpu_uuid: Identifier
    gpu_model: Annotated[str, Field(max_length=128)] = ""
    memory_used_bytes: NonNegativeInt
    memory_total_bytes: NonNegativeInt
    utilisation_pct: Annotated[float, Field(ge=0, le=100)] | None = None
    temperature_c: float | None = None
    sm_clock_mhz: Annotated[float, Field(ge=0)] | None = None
    throttle_reasons: NonNegativeInt = 0
    power_w: Annotated[float, Field(ge=0)] | None = None


class GradSyncSample(_Sample):
    kind: Literal["grad_sync"] = "grad_sync"
    step: NonNegativeInt
    bytes: NonNegativeInt
    latency_ms: Annotated[float, Field(ge=0)]
    ok: bool = True
    op: Annotated[str, Field(max_length=64)] = "all_reduce"
    timer: Literal["wall_clock", "cuda_event"] = "wall_clock"
    error: Annotated[str, Field(max_length=256)] | None = None


class CudaMemorySample(_Sample):
    """``torch.cuda.memory_stats`` of the device the training thread uses."""

    kind: Literal["cuda_memory"] = "cuda_memory"
    device_index: NonNegativeInt
    allocated_bytes: NonNegativeInt
    reserved_bytes: NonNegativeInt
    active_bytes: NonNegativeInt = 0
    peak_allocated_bytes: NonNegativeInt = 0
    # Reserved but not allocated, as a share of reserved: 0 when nothing is reserved.
    fragmentation_ratio: Annotated[float, Field(ge=0, le=1)] = 0.0
    oom_count: NonNegativeInt = 0
    alloc_retry_count: NonNegativeInt = 0


class RuntimeSample(_Sample):
    """A non-Python runtime (an agent platform) as it registered with the ingest gateway."""

    kind: Literal["runtime"] = "runtime"
    runtime_type: Annotated[str, Field(min_length=1, max_length=64)]
    concurrency: Annotated[int, Field(ge=1, le=1_000_000)]
    mean_call_latency_ms: Annotated[float, Field(ge=0)]
    function_calling: bool


MetricSample = Annotated[
    HeartbeatSample
    | StepSample
    | EpisodeSample
    | GpuSample
    | GradSyncSample
    | CudaMemorySample
    | RuntimeSample,
    Field(discriminator="kind"),
]


class MetricBatch(Event):
    """One probe flush: the worker's identity once, its samples since the last flush."""

    identity: WorkerIdentity
    gpu_uuid: Identifier | None = None
    samples: Annotated[list[MetricSample], Field(max_length=100_000)]

"""Synthetic metric traces with known answers, for tests, benchmarks and ``dsec replay``.

Each trace is a list of columnar ``MetricBatch``es, one per second of a worker's life.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from dsec.schemas import MetricBatch, MetricColumns, WorkerIdentity
from dsec.schemas.metrics import (
    EpisodeColumns,
    GpuColumns,
    GradSyncColumns,
    HeartbeatColumns,
    RecoveryColumns,
    StepColumns,
)

GIB = 1 << 30


@dataclass(frozen=True)
class TraceIdentity:
    job_id: str = "synthetic"
    worker_id: str = "worker-000"
    node_id: str = "node-00"
    gpu_uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    start_ms: int = 1_800_000_000_000

    def worker(self) -> WorkerIdentity:
        return WorkerIdentity(job_id=self.job_id, worker_id=self.worker_id, node_id=self.node_id)


def bench_identities(workers: int, start_ms: int) -> list[TraceIdentity]:
    """The throughput benchmarks' workers: job ``bench``, eight workers a node."""
    return [TraceIdentity(job_id="bench", worker_id=f"worker-{w:03d}",
                          node_id=f"node-{w // 8:02d}", start_ms=start_ms)
            for w in range(workers)]


def _batch(ident: TraceIdentity, second: int, columns: MetricColumns) -> MetricBatch:
    return MetricBatch(
        event_id=f"{ident.worker_id}-{second:08d}".replace("/", "_").ljust(8, "0"),
        event_time_ms=ident.start_ms + (second + 1) * 1000,
        identity=ident.worker(), gpu_uuid=ident.gpu_uuid, columns=columns,
    )


def _heartbeat(t_ms: int) -> HeartbeatColumns:
    return HeartbeatColumns(event_time_ms=[t_ms], interval_s=[1.0])


def leak_on_long_episodes(
    ident: TraceIdentity,
    leak_bytes_per_s: float,
    phase_s: int = 30,
    phases: int = 4,
    short_length: int = 50,
    long_length: int = 400,
    episodes_per_s: int = 20,
    gpu_samples_per_s: int = 10,
) -> list[MetricBatch]:
    """Alternating phases of long and short episodes; device memory grows by
    ``leak_bytes_per_s`` during long ones only and stays flat during short ones."""
    batches, used = [], 10 * GIB
    for second in range(phase_s * phases):
        long_phase = (second // phase_s) % 2 == 0
        t0 = ident.start_ms + second * 1000
        gpu_times = [t0 + i * 1000 // gpu_samples_per_s for i in range(gpu_samples_per_s)]
        gpu_used = []
        for _ in gpu_times:
            gpu_used.append(int(used))
            if long_phase:
                used += leak_bytes_per_s / gpu_samples_per_s
        length = long_length if long_phase else short_length
        episodes = EpisodeColumns(
            event_time_ms=[t0 + i for i in range(episodes_per_s)],
            episode_index=[second * episodes_per_s + i for i in range(episodes_per_s)],
            reward=[float(length)] * episodes_per_s, length=[length] * episodes_per_s,
        )
        gpu = GpuColumns(
            event_time_ms=gpu_times, gpu_uuid=[ident.gpu_uuid] * len(gpu_times),
            gpu_model=[ident.gpu_model] * len(gpu_times), memory_used_bytes=gpu_used,
            memory_total_bytes=[80 * GIB] * len(gpu_times),
            utilisation_pct=[90.0] * len(gpu_times), temperature_c=[65.0] * len(gpu_times),
        )
        columns = MetricColumns(episode=episodes, gpu=gpu, heartbeat=_heartbeat(t0 + 999))
        batches.append(_batch(ident, second, columns))
    return batches


def reward_variance_jump(
    ident: TraceIdentity,
    jump_at_episode: int,
    episodes: int,
    episodes_per_s: int = 10,
    calm_std: float = 0.5,
    wild_std: float = 10.0,
    seed: int = 0,
) -> list[MetricBatch]:
    """Rewards around 100 with ``calm_std`` until ``jump_at_episode``, ``wild_std`` after."""
    rng = random.Random(seed)
    batches = []
    for second in range(math.ceil(episodes / episodes_per_s)):
        t0 = ident.start_ms + second * 1000
        indices = range(second * episodes_per_s, min(episodes, (second + 1) * episodes_per_s))
        rewards = [rng.gauss(100.0, calm_std if i < jump_at_episode else wild_std)
                   for i in indices]
        columns = MetricColumns(
            episode=EpisodeColumns(
                event_time_ms=[t0 + k for k in range(len(rewards))], episode_index=list(indices),
                reward=rewards, length=[200] * len(rewards),
            ),
            heartbeat=_heartbeat(t0 + 999),
        )
        batches.append(_batch(ident, second, columns))
    return batches


def grad_norm_decay(
    ident: TraceIdentity,
    log_slope_per_step: float,
    steps: int,
    steps_per_s: int = 100,
    initial_norm: float = 10.0,
) -> list[MetricBatch]:
    """Gradient norms ``initial_norm * exp(log_slope_per_step * step)``."""
    batches = []
    for second in range(math.ceil(steps / steps_per_s)):
        t0 = ident.start_ms + second * 1000
        indices = list(range(second * steps_per_s, min(steps, (second + 1) * steps_per_s)))
        columns = MetricColumns(
            step=StepColumns(
                event_time_ms=[t0 + k * 1000 // steps_per_s for k in range(len(indices))],
                step=indices, loss=[1.0] * len(indices),
                grad_norm=[initial_norm * math.exp(log_slope_per_step * i) for i in indices],
            ),
            heartbeat=_heartbeat(t0 + 999),
        )
        batches.append(_batch(ident, second, columns))
    return batches


def training_batch(ident: TraceIdentity, index: int, samples: int, seed: int = 0) -> MetricBatch:
    """A probe-shaped flush of ``samples`` step samples (for throughput benchmarks)."""
    rng = random.Random(seed * 1_000_003 + index)
    t0 = ident.start_ms + index * 100
    first_step = index * samples
    columns = MetricColumns(step=StepColumns(
        event_time_ms=[t0 + k // 10 for k in range(samples)],
        step=list(range(first_step, first_step + samples)),
        loss=[rng.random() for _ in range(samples)],
        grad_norm=[1.0 + rng.random() for _ in range(samples)],
        step_time_ms=[2.0] * samples,
    ))
    return MetricBatch(
        event_id=f"bench-{ident.worker_id}-{index:09d}", event_time_ms=t0 + 100,
        identity=ident.worker(), columns=columns,
    )


def slow_grad_sync(
    ident: TraceIdentity,
    seconds: int,
    latency_ms: float,
    syncs_per_s: int = 10,
    failed_every: int = 0,
    samples_dropped_per_s: int = 0,
    recovery_time_s: float | None = None,
    utilisation_pct: float = 90.0,
    memory_used_bytes: int = 10 * GIB,
    heartbeat_interval_s: float = 1.0,
) -> list[MetricBatch]:
    """Gradient syncs taking ``latency_ms`` each (every ``failed_every``-th one failing,
    when given), one GPU sample (the worker alone on its card: all of ``memory_used_bytes``
    is its own) and a heartbeat a second whose probe counts ``samples_dropped_per_s`` more
    dropped samples each time; a resume from a snapshot that took ``recovery_time_s`` opens
    the trace, when given."""
    batches = []
    for second in range(seconds):
        t0 = ident.start_ms + second * 1000
        indices = range(second * syncs_per_s, (second + 1) * syncs_per_s)
        syncs = GradSyncColumns(
            event_time_ms=[t0 + k * 1000 // syncs_per_s for k in range(syncs_per_s)],
            step=list(indices), bytes=[1 << 20] * syncs_per_s,
            latency_ms=[latency_ms] * syncs_per_s,
            ok=[not (failed_every and (i + 1) % failed_every == 0) for i in indices],
        )
        gpu = GpuColumns(
            event_time_ms=[t0], gpu_uuid=[ident.gpu_uuid], gpu_model=[ident.gpu_model],
            memory_used_bytes=[memory_used_bytes], memory_total_bytes=[80 * GIB],
            process_memory_used_bytes=[memory_used_bytes],
            utilisation_pct=[utilisation_pct], temperature_c=[65.0],
        )
        heartbeat = HeartbeatColumns(
            event_time_ms=[t0 + 999], interval_s=[heartbeat_interval_s],
            samples_dropped=[samples_dropped_per_s * (second + 1)])
        recovery = (RecoveryColumns(event_time_ms=[t0], recovery_time_s=[recovery_time_s])
                    if second == 0 and recovery_time_s is not None else None)
        columns = MetricColumns(grad_sync=syncs, gpu=gpu, heartbeat=heartbeat, recovery=recovery)
        batches.append(_batch(ident, second, columns))
    return batches

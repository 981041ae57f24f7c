"""One fleet size's control-plane cost, each service measured in a process of its own.

The policy engine: one whole step over one feature event per target (as
``dsec bench policy-eval`` measures it). The metrics stream job: the ``MetricsJob`` stage,
fed probe-shaped messages of every worker for a few seconds, then timed on one more
second; its state is the bytes the Faust table would hold per worker. Inputs are made
before the clock starts and dropped before the resident memory is read.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from dsec.infra.records import Record
from dsec.schemas import MetricBatch, MetricColumns, WorkerIdentity, encode
from dsec.schemas.metrics import (
    EpisodeColumns,
    GpuColumns,
    GradSyncColumns,
    HeartbeatColumns,
    StepColumns,
)

START_MS = 1_800_000_000_000


@dataclass(frozen=True)
class ProbeRates:
    """What one worker sends, per second of its life (the probe's defaults on a worker
    that steps four times a second and ends an episode every five seconds)."""

    steps_per_s: int = 4
    grad_syncs_per_s: int = 4
    gpu_samples_per_s: int = 1
    episode_every_s: int = 5
    heartbeat_every_s: int = 5

    def samples_per_s(self) -> float:
        return (self.steps_per_s + self.grad_syncs_per_s + self.gpu_samples_per_s
                + 1 / self.episode_every_s + 1 / self.heartbeat_every_s)


def worker_second(worker: int, second: int, rates: ProbeRates,
                  start_ms: int = START_MS) -> MetricBatch:
    """One second of one worker, as one probe message; its life began at ``start_ms``."""
    t_ms = start_ms + second * 1000
    gpu_uuid = f"GPU-{worker:08d}-0000-0000-0000-000000000000"
    steps = [second * rates.steps_per_s + k for k in range(rates.steps_per_s)]
    times_ms = [t_ms + k * 1000 // rates.steps_per_s for k in range(rates.steps_per_s)]
    syncs = steps[: rates.grad_syncs_per_s]
    columns = MetricColumns(
        step=StepColumns(event_time_ms=times_ms, step=steps,
                         loss=[0.5 + 0.01 * (second % 13)] * len(steps),
                         grad_norm=[1.0 + 0.001 * step for step in steps],
                         step_time_ms=[1000.0 / rates.steps_per_s] * len(steps)),
        grad_sync=GradSyncColumns(event_time_ms=times_ms[: len(syncs)], step=syncs,
                                  bytes=[1 << 24] * len(syncs),
                                  latency_ms=[20.0 + (second % 5)] * len(syncs)),
        gpu=GpuColumns(event_time_ms=[t_ms], gpu_uuid=[gpu_uuid], gpu_model=["NVIDIA H100"],
                       memory_used_bytes=[(40 << 30) + second * (1 << 20)],
                       memory_total_bytes=[80 << 30], utilisation_pct=[90.0],
                       temperature_c=[60.0]),
        heartbeat=(HeartbeatColumns(event_time_ms=[t_ms], interval_s=[5.0])
                   if second % rates.heartbeat_every_s == 0 else None),
        episode=(EpisodeColumns(event_time_ms=[t_ms], episode_index=[second],
                                reward=[float(second % 7)], length=[200 + second % 11])
                 if second % rates.episode_every_s == 0 else None),
    )
    return MetricBatch(
        event_id=f"scale-{worker:06d}-{second:06d}", event_time_ms=t_ms + 1000,
        identity=WorkerIdentity(job_id="scale", worker_id=f"w{worker:06d}",
                                node_id=f"n{worker // 8:05d}"),
        gpu_uuid=gpu_uuid, columns=columns,
    )


def _messages(topic: str, workers: int, second: int, rates: ProbeRates) -> list[Record]:
    """Every worker's message of one second, on one partition in offset order."""
    records = []
    for worker in range(workers):
        batch = worker_second(worker, second, rates)
        records.append(Record(topic, 0, second * workers + worker,
                              batch.identity.worker_id.encode(), encode(batch)))
    return records


def _rss_bytes() -> dict[str, int]:
    """The process's resident memory now and at its peak (``/proc/self/status``)."""
    from dsec.bench.service_processes import status_bytes

    return {"rss_bytes": status_bytes("self", "VmRSS") or 0,
            "peak_rss_bytes": status_bytes("self", "VmHWM") or 0}


def measure_stream_job(workers: int, warm_up_s: int = 2) -> dict:
    """The metrics job over ``workers`` workers: CPU per message and per sample, feature
    events per CPU second, state bytes per worker, the process's memory."""
    from dsec.schemas.topics import topic_names
    from dsec.stream_jobs.metrics_job import MetricsJob

    rates = ProbeRates()
    topics = topic_names("scale")
    job = MetricsJob(topics, {}, clock_ms=lambda: START_MS)
    for second in range(warm_up_s):
        warm = job.process(_messages(topics.metrics, workers, second, rates),
                           batch_ms=START_MS + (second + 2) * 1000)
        job.save(warm.states)
    timed = _messages(topics.metrics, workers, warm_up_s, rates)
    gc.collect()
    start = time.process_time()
    result = job.process(timed, batch_ms=START_MS + (warm_up_s + 2) * 1000)
    job.save(result.states)
    cpu_s = time.process_time() - start
    features = len(result.features)
    del timed, result
    gc.collect()
    state_bytes = sum(len(state.to_bytes()) for state in job.states.values())
    return {
        "workers": workers,
        "cpu_s_per_message": cpu_s / workers,
        "cpu_s_per_million_samples": cpu_s / (workers * rates.samples_per_s()) * 1e6,
        "feature_events_per_cpu_s": features / cpu_s if cpu_s else None,
        "state_bytes_per_worker": state_bytes / max(1, len(job.states)),
        **_rss_bytes(),
    }


def measure_engine(targets: int) -> dict:
    """Whole engine steps over ``targets`` targets, 1 % of them tripping (30 s of event
    time, a step every 5 s): from a packed batch, and (each in a fresh engine) from
    decoded feature events and from the features topic's bytes, decoded in the step as
    the policy engine's agent does: single events (``wire``) and the metrics job's
    ``FeatureColumns`` messages (``columns``). ``step_ms`` is the median step, ``step_mean_ms`` the
    mean and ``step_max_ms`` the slowest."""
    import statistics

    from dsec.bench.policy_eval import engine_step_times_ms

    packed = engine_step_times_ms(targets)
    gc.collect()
    step_ms = statistics.median(packed)
    result = {"targets": targets, "step_ms": step_ms, "step_mean_ms": statistics.fmean(packed),
              "step_max_ms": max(packed), "per_target_us": step_ms * 1000 / targets}
    for source in ("events", "wire", "columns"):
        times = engine_step_times_ms(targets, source=source)
        gc.collect()
        median_ms = statistics.median(times)
        result |= {f"step_from_{source}_ms": median_ms,
                   f"step_from_{source}_mean_ms": statistics.fmean(times),
                   f"per_target_from_{source}_us": median_ms * 1000 / targets}
    return {**result, **_rss_bytes()}

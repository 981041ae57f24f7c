"""The metrics job's Prometheus instruments, updated once per batch from what it gave."""

from __future__ import annotations

import time

from dsec.infra.observability.metrics import (
    EVENTS_DEAD_LETTERED,
    EVENTS_IN,
    EVENTS_OUT,
    FEATURE_UPDATE_LATENCY,
    GRADIENT_SYNC_SUCCESS_RATE,
    PROBE_SAMPLES_DROPPED,
    SANDBOX_UTILIZATION_RATE,
    SNAPSHOT_RECOVERY_TIME,
    WORKERS_LOST,
    ProcessMetrics,
    dead_letter_reason,
)
from dsec.schemas.topics import TopicNames
from dsec.stream_jobs.metrics_job import BatchResult, LivenessResult

SERVICE = "stream-jobs"


class JobInstruments:
    """Bound to their labels once; updated once per batch of messages, from what the batch
    saw, never per sample."""

    def __init__(self, metrics: ProcessMetrics, topics: TopicNames,
                 utilisation_ttl_s: float = 60.0) -> None:
        events_in, events_out = metrics.counter(EVENTS_IN), metrics.counter(EVENTS_OUT)
        self.messages_in = events_in.labels(SERVICE, topics.metrics)
        self.features_out = events_out.labels(SERVICE, topics.features)
        self.gpu_profiles_out = events_out.labels(SERVICE, topics.gpu_profiles)
        self.dead_letters_out = events_out.labels(SERVICE, topics.dead_letters)
        self.dead_lettered = metrics.counter(EVENTS_DEAD_LETTERED)
        self.batch_latency = metrics.histogram(FEATURE_UPDATE_LATENCY)
        self.recovery_time = metrics.histogram(SNAPSHOT_RECOVERY_TIME)
        self.sync_success = metrics.latest(GRADIENT_SYNC_SUCCESS_RATE)
        self.samples_dropped = metrics.latest(PROBE_SAMPLES_DROPPED)
        self.workers_lost = metrics.gauge(WORKERS_LOST)
        # The mean over workers of each one's latest device utilisation (ratio).
        self.utilisation = metrics.mean_of_latest(SANDBOX_UTILIZATION_RATE, utilisation_ttl_s)

    def batch_done(self, started_s: float, messages: int, result: BatchResult) -> None:
        """``started_s``: ``time.perf_counter()`` when the batch began."""
        for reason in result.dead_letter_reasons:
            self.dead_lettered.labels(SERVICE, dead_letter_reason(reason)).inc()
        self.dead_letters_out.inc(len(result.dead_letter_reasons))
        self.features_out.inc(len(result.per_record) - len(result.dead_letter_reasons))
        self.gpu_profiles_out.inc(len(result.gpu_profiles))
        self.messages_in.inc(messages)
        self.batch_latency.observe(time.perf_counter() - started_s)
        sync, dropped, utilisation = [], [], []
        for worker, in_order in result.derived.items():
            latest: dict[str, float] = {}
            for features in in_order:
                latest.update(features)
            if (value := latest.get("grad_sync_success_rate")) is not None:
                sync.append(((worker,), value))
            if (value := latest.get("probe_samples_dropped")) is not None:
                dropped.append(((worker,), value))
            if (value := latest.get("gpu_utilisation_pct")) is not None:
                utilisation.append(((worker,), value / 100.0))
        if sync:
            self.sync_success.set_many(sync)
        if dropped:
            self.samples_dropped.set_many(dropped)
        if utilisation:
            self.utilisation.set_many(utilisation)
        for times in result.recovery_times_s:
            for value in times:
                self.recovery_time.observe(float(value))

    def liveness_checked(self, result: LivenessResult) -> None:
        self.features_out.inc(len(result.outputs))
        self.workers_lost.set(result.lost_workers)

"""The stream jobs' Prometheus instruments: the metrics job's, updated once per batch from
what it gave, and the fleet job's per-pool gauges, set from each scope's fleet features."""

from __future__ import annotations

import time

from dsec.infra.observability.metrics import (
    EVENTS_DEAD_LETTERED,
    EVENTS_IN,
    EVENTS_OUT,
    FEATURE_UPDATE_LATENCY,
    GRADIENT_SYNC_SUCCESS_RATE,
    MELT_DOWN_COUNT,
    PROBE_SAMPLES_DROPPED,
    SANDBOX_UTILIZATION_RATE,
    SNAPSHOT_RECOVERY_TIME,
    WORKERS_LOST,
    ProcessMetrics,
    dead_letter_reason,
)
from dsec.infra.records import Record
from dsec.schemas.topics import TopicNames
from dsec.stream_jobs.fleet_job import FleetTick
from dsec.stream_jobs.metrics_job import BatchResult, LivenessResult

SERVICE = "stream-jobs"


class JobInstruments:
    """Bound to their labels once; updated once per batch of messages, from what the batch
    saw, never per sample."""

    def __init__(self, metrics: ProcessMetrics, topics: TopicNames) -> None:
        events_in, events_out = metrics.counter(EVENTS_IN), metrics.counter(EVENTS_OUT)
        self.messages_in = events_in.labels(SERVICE, topics.metrics)
        self.features_out = events_out.labels(SERVICE, topics.features)
        self.gpu_profiles_out = events_out.labels(SERVICE, topics.gpu_profiles)
        self.dead_letters_out = events_out.labels(SERVICE, topics.dead_letters)
        self.dead_lettered = metrics.counter(EVENTS_DEAD_LETTERED)
        self.batch_latency = metrics.histogram(FEATURE_UPDATE_LATENCY)
        self.recovery_time = metrics.histogram(SNAPSHOT_RECOVERY_TIME)
        self.samples_dropped = metrics.latest(PROBE_SAMPLES_DROPPED)
        self.workers_lost = metrics.gauge(WORKERS_LOST)

    def dead_lettered_batch(self, reason_class: str, messages: int) -> None:
        """A batch the job failed on, its messages dead-lettered."""
        self.dead_lettered.labels(SERVICE, reason_class).inc(messages)
        self.dead_letters_out.inc(messages)

    def batch_done(self, started_s: float, messages: int, result: BatchResult) -> None:
        """``started_s``: ``time.perf_counter()`` when the batch began."""
        for reason in result.dead_letter_reasons:
            self.dead_lettered.labels(SERVICE, dead_letter_reason(reason)).inc()
        self.dead_letters_out.inc(len(result.dead_letter_reasons))
        self.features_out.inc(len(result.features))
        self.gpu_profiles_out.inc(len(result.gpu_profiles))
        self.messages_in.inc(messages)
        self.batch_latency.observe(time.perf_counter() - started_s)
        dropped = []
        for worker, in_order in result.derived.items():
            latest: dict[str, float] = {}
            for features in in_order:
                latest.update(features)
            if (value := latest.get("probe_samples_dropped")) is not None:
                dropped.append(((worker,), value))
        if dropped:
            self.samples_dropped.set_many(dropped)
        for times in result.recovery_times_s:
            for value in times:
                self.recovery_time.observe(float(value))

    def liveness_checked(self, result: LivenessResult) -> None:
        self.features_out.inc(len(result.outputs))
        self.workers_lost.set(result.lost_workers)


# Which gauge each fleet feature sets; labelled by pool (empty for a whole job) and job.
_FLEET_GAUGES = (
    (SANDBOX_UTILIZATION_RATE, "pool_utilisation_rate"),
    (GRADIENT_SYNC_SUCCESS_RATE, "fleet_grad_sync_success_rate"),
    (MELT_DOWN_COUNT, "breaker_trips_per_hour"),
)


class FleetInstruments:
    """The per-pool gauges, set at each tick of the fleet job; a scope not published for
    ``ttl_s`` (gone) stops being reported."""

    def __init__(self, metrics: ProcessMetrics, topics: TopicNames, ttl_s: float) -> None:
        self.records_in = metrics.counter(EVENTS_IN)
        self.features_out = metrics.counter(EVENTS_OUT).labels(SERVICE, topics.features)
        self.gauges = [(metrics.latest(spec, ttl_s), name) for spec, name in _FLEET_GAUGES]

    def routed(self, records: list[Record]) -> None:
        topics: dict[str, int] = {}
        for record in records:
            topics[record.topic] = topics.get(record.topic, 0) + 1
        for topic, count in topics.items():
            self.records_in.labels(SERVICE, topic).inc(count)

    def ticked(self, tick: FleetTick) -> None:
        self.features_out.inc(len(tick.outputs))
        for gauge, name in self.gauges:
            gauge.set_many(
                ((event.identity.pool or "", event.identity.job_id), event.features[name])
                for event in tick.events if name in event.features)

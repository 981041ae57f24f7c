"""The metrics job: validate probe batches (bad ones → dead letters), derive per-worker
features and per-GPU profile contributions, and publish them.

The agent takes events in batches and only routes and keeps state; the statistics
live in ``stats`` and ``worker_features`` as pure functions. Per-worker state is a
Faust table keyed like the metrics topic (by worker), so a restarted or rebalanced
stream worker resumes from it. A batch's input offsets are acknowledged after every
output of the batch is delivered; Faust's ``take_events`` acknowledges in a ``finally``,
so a batch whose processing raises is acknowledged too (a known gap).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass

import numpy as np

from dsec.infra.faust_app import (
    TP,
    App,
    EventT,
    StreamT,
    dead_letter_for,
    fetch_topic_metadata,
)
from dsec.infra.faust_app import publish as publish_to
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
from dsec.schemas import (
    DecodeError,
    FeatureEvent,
    GpuProfileEvent,
    WorkerIdentity,
    encode,
    now_ms,
)
from dsec.schemas.event_times import EventTimeWindow
from dsec.schemas.fast_decode import decode_metric_batch
from dsec.schemas.features import RegimeGrowth
from dsec.schemas.metrics import duplicate_key
from dsec.schemas.topics import TopicNames
from dsec.stream_jobs import finite, worker_features
from dsec.stream_jobs.worker_features import FeatureConfig

log = logging.getLogger(__name__)


@dataclass
class JobCounters:
    messages_in: int = 0
    samples_in: int = 0
    replayed_skipped: int = 0
    dead_letters: int = 0
    features_out: int = 0
    gpu_profiles_out: int = 0


METRICS_JOB_TABLES = ("worker-state",)
SERVICE = "stream-jobs"


class _JobInstruments:
    """The metrics job's Prometheus instruments, bound to their labels once; updated once
    per batch of messages, from what the batch saw, never per sample."""

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

    def batch_done(self, started_s: float, messages: int,
                   derived: dict[str, list[dict[str, float]]],
                   recoveries: list[np.ndarray]) -> None:
        """``derived``: per worker, the features of each of its messages in the batch."""
        self.messages_in.inc(messages)
        self.batch_latency.observe(time.perf_counter() - started_s)
        sync, dropped, utilisation = [], [], []
        for worker, in_order in derived.items():
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
        for times in recoveries:
            for value in times:
                self.recovery_time.observe(float(value))


def derived_event_id(*parts: object) -> str:
    """A deterministic id: re-deriving the same output after a replay gives the same id."""
    return hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=16).hexdigest()


def register_metrics_job(
    app: App,
    topics: TopicNames,
    config: FeatureConfig | None = None,
    batch_max_messages: int = 500,
    batch_within_s: float = 0.05,
    metrics: ProcessMetrics | None = None,
    loop_turn_every_s: float = 0.001,
    event_times: EventTimeWindow | None = None,
) -> JobCounters:
    """``event_times``: the sample times the store keeps; batches with samples outside it
    are dead-lettered (the default: the store's default window)."""
    event_times = event_times or EventTimeWindow()
    config = config or FeatureConfig()
    counters = JobCounters()
    instruments = _JobInstruments(metrics or ProcessMetrics(), topics)
    metrics = app.topic(topics.metrics, value_type=bytes, key_type=bytes)
    # Keyed by worker id, partitioned as the metrics topic is: a worker's state lives
    # with its events, and timers may update it outside any event.
    # Raw keys (the worker id's bytes, as on the metrics topic): the changelog partition
    # chosen by the partitioner is then the partition the worker's events are on.
    # partition -> the highest source offset processed here: a worker is judged silent
    # only where everything on its partition has been read.
    processed_through: dict[int, int] = {}
    worker_state = app.Table(
        "worker-state", default=dict, partitions=None, key_type=bytes, use_partitioner=True
    )

    async def publish(topic: str, key: bytes, value: bytes) -> asyncio.Future:
        """Hands an output to the producer; the future resolves once the broker has it."""
        return await publish_to(app, topic, key, value)

    def feature_event(
        identity: WorkerIdentity, values: dict[str, float], event_id: str,
        tags: dict[str, str] | None = None,
    ) -> bytes:
        return encode(FeatureEvent(
            event_id=event_id, identity=identity, window="rolling", features=values,
            tags=tags or {},
        ))

    async def dead_letter(event: EventT, reason: str) -> asyncio.Future:
        counters.dead_letters += 1
        instruments.dead_lettered.labels(SERVICE, dead_letter_reason(reason)).inc()
        instruments.dead_letters_out.inc()
        return await publish(topics.dead_letters, event.message.topic.encode(),
                             encode(dead_letter_for(event, reason)))

    async def process(events: list[EventT]) -> None:
        started_s = time.perf_counter()
        sends = []
        derived: dict[str, list[dict[str, float]]] = {}
        recoveries: list[np.ndarray] = []
        gpus: dict[tuple[str, str], tuple[WorkerIdentity, worker_features.GpuContribution,
                                          int, int]] = {}
        states: dict[str, dict] = {}
        features_out = 0
        wall_ms = now_ms()
        turn_s = started_s
        for event in events:
            if time.perf_counter() - turn_s > loop_turn_every_s:
                # A turn of the event loop now and then: the consumer's fetcher and the
                # producer's sender run in it, and a batch worked through in one go would
                # leave the next batch unfetched and this one's outputs unsent until the end.
                await asyncio.sleep(0)
                turn_s = time.perf_counter()
            counters.messages_in += 1
            message = event.message
            if message.offset > processed_through.get(message.partition, -1):
                processed_through[message.partition] = message.offset
            try:
                decoded = decode_metric_batch(event.value, event_times, wall_ms)
            except DecodeError as exc:
                sends.append(await dead_letter(event, exc.reason))
                continue
            batch, frames = decoded.header, decoded.frames
            worker = batch.identity.worker_id
            counters.samples_in += decoded.sample_count()
            state = states[worker] if worker in states else worker_state[worker.encode()]
            result, problem = finite.checked_update(
                state, frames, message.partition, message.offset, wall_ms, config,
                duplicate_key(batch))
            if problem is not None:
                sends.append(await dead_letter(event, problem))
                continue
            if result.skipped:
                counters.replayed_skipped += 1
                continue
            if "recovery" in frames:
                recoveries.append(frames["recovery"]["recovery_time_s"])
            state = dict(result.state)
            state["identity"] = batch.identity.model_dump()
            state["partition"] = message.partition
            states[worker] = state
            if result.features:
                # One feature event per input message, with an id derived from it.
                event_id = derived_event_id("features", worker, message.partition,
                                            message.offset)
                sends.append(await publish(
                    topics.features, worker.encode(),
                    feature_event(batch.identity, result.features, event_id, result.tags),
                ))
                counters.features_out += 1
                features_out += 1
                derived.setdefault(worker, []).append(result.features)
            for contribution in result.gpus:
                gpus[(contribution.gpu_uuid, worker)] = (
                    batch.identity, contribution, message.partition, message.offset)
        for (uuid, worker), (identity, contribution, partition, offset) in gpus.items():
            profile = GpuProfileEvent(
                event_id=derived_event_id("gpu", uuid, worker, partition, offset),
                gpu_uuid=uuid, gpu_model=contribution.gpu_model, identity=identity,
                regimes={name: RegimeGrowth(delta_bytes=d_bytes, delta_s=d_s)
                         for name, (d_bytes, d_s) in contribution.regimes.items()},
                thermal_throttle_events=contribution.thermal_throttle_events,
                bandwidth_jitter=contribution.bandwidth_jitter,
                samples=contribution.samples,
            )
            sends.append(await publish(topics.gpu_profiles, f"{uuid}/{worker}".encode(),
                                       encode(profile)))
            counters.gpu_profiles_out += 1
        # Outputs first, state second: a crash in between replays the batch, which derives
        # the same outputs under the same ids (deduplicated downstream).
        if sends:
            await asyncio.gather(*sends)
        for worker, state in states.items():
            worker_state[worker.encode()] = state
        instruments.features_out.inc(features_out)
        instruments.gpu_profiles_out.inc(len(gpus))
        instruments.batch_done(started_s, len(events), derived, recoveries)

    @app.agent(metrics, name="metrics-job")
    async def metrics_job(stream: StreamT) -> None:
        await fetch_topic_metadata(app, worker_state.changelog_topic.get_topic_name())
        async for events in stream.take_events(batch_max_messages, within=batch_within_s):
            await process(list(events))

    def caught_up(partition: int | None) -> bool:
        """Every message on the partition, up to its end as last fetched, is processed."""
        if partition is None:
            return False
        try:
            end = app.consumer.highwater(TP(topics.metrics, partition))
        except Exception:  # not assigned here (any more)
            return False
        return end is not None and processed_through.get(partition, -1) >= end - 1

    @app.timer(interval=1.0)
    async def liveness_check() -> None:
        wall_ms = int(time.time() * 1000)
        lost_workers = 0
        for key, state in list(worker_state.items()):
            new_state, lost = worker_features.liveness(
                state, wall_ms, config, caught_up(state.get("partition")))
            if lost is None:
                lost_workers += bool(state.get("lost"))
                continue
            lost_workers += 1
            worker = key.decode()
            identity = WorkerIdentity.model_validate(state["identity"])
            event_id = derived_event_id("lost", worker, state.get("last_heartbeat_ms"))
            await (await publish(topics.features, worker.encode(),
                                 feature_event(identity, lost, event_id)))
            worker_state[key] = new_state
            counters.features_out += 1
            instruments.features_out.inc()
            log.warning("worker %s lost: silent for %.1f s", worker, lost["heartbeat_age_s"])
        instruments.workers_lost.set(lost_workers)

    return counters

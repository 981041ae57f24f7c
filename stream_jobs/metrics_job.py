"""The metrics job: validate probe batches (bad ones → dead letters) and derive reward features.

The agent only routes and keeps state (per-worker reward windows in a Faust table);
the statistics are the pure functions of ``reward_stats``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import faust

from dsec.schemas import (
    DeadLetter,
    DecodeError,
    EpisodeSample,
    FeatureEvent,
    MetricBatch,
    decode,
    encode,
)
from dsec.schemas.topics import TopicNames
from dsec.stream_jobs.reward_stats import append_bounded, reward_window_features

log = logging.getLogger(__name__)


@dataclass
class JobCounters:
    messages_in: int = 0
    samples_in: int = 0
    dead_letters: int = 0
    features_out: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


def dead_letter_for(event: faust.EventT, reason: str) -> DeadLetter:
    message = event.message
    return DeadLetter.for_message(
        topic=message.topic, partition=message.partition, offset=message.offset,
        reason=reason, payload=message.value,
    )


def register_metrics_job(
    app: faust.App, topics: TopicNames, window_episodes: int = 20
) -> JobCounters:
    counters = JobCounters()
    metrics = app.topic(topics.metrics, value_type=bytes, key_type=bytes)
    features = app.topic(topics.features, value_type=bytes, key_type=bytes)
    dead_letters = app.topic(topics.dead_letters, value_type=bytes, key_type=bytes)
    reward_windows = app.Table(
        "reward-windows", default=list, partitions=None, value_type=list
    )

    async def send_durably(topic: faust.TopicT, key: bytes, value: bytes) -> None:
        # Awaiting the delivery keeps the input offset from being acked before the output is stored.
        await (await topic.send(key=key, value=value))

    @app.agent(metrics, name="metrics-job")
    async def metrics_job(stream: faust.StreamT) -> None:
        async for event in stream.events():
            counters.messages_in += 1
            try:
                batch = decode(event.value, MetricBatch)
            except DecodeError as exc:
                counters.dead_letters += 1
                letter = dead_letter_for(event, exc.reason)
                await send_durably(dead_letters, event.message.topic.encode(), encode(letter))
                continue
            counters.samples_in += len(batch.samples)
            for sample in batch.samples:
                counters.by_kind[sample.kind] = counters.by_kind.get(sample.kind, 0) + 1
            rewards = [s.reward for s in batch.samples if isinstance(s, EpisodeSample)]
            if not rewards:
                continue
            worker = batch.identity.worker_id
            window = append_bounded(reward_windows[worker], rewards, 2 * window_episodes)
            reward_windows[worker] = window
            values = reward_window_features(window, window_episodes)
            feature = FeatureEvent(
                identity=batch.identity,
                gpu_uuid=batch.gpu_uuid,
                window=f"last_{window_episodes}_episodes",
                features=values,
            )
            await send_durably(features, worker.encode(), encode(feature))
            counters.features_out += 1

    return counters

"""Where each reaction trial's time went, read back from the topics after the trials.

Each message carries the wall-clock time its producer handed it over (Kafka's CreateTime):
the probe's flush holding the NaN step, the stream job's feature event counting it, the
policy engine's command to the worker. The earliest of each per worker is kept.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator

from confluent_kafka import Consumer, Message, TopicPartition

from dsec.bench.reaction_figures import StageTimes
from dsec.infra.kafka_clients import consumer_config
from dsec.schemas import ActuationCommand, DecodeError, FeatureEvent, decode, topic_names
from dsec.schemas.fast_decode import decode_metric_batch
from dsec.schemas.settings import DsecSettings


def _read_to_end(consumer: Consumer, topics: list[str], timeout_s: float) -> Iterator[Message]:
    """Every message the topics hold now, from the start of each partition."""
    ends: dict[tuple[str, int], int] = {}
    assignment = []
    for topic in topics:
        for partition in consumer.list_topics(topic, timeout=30).topics[topic].partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=30)
            if high > low:
                ends[(topic, partition)] = high
                assignment.append(TopicPartition(topic, partition, low))
    consumer.assign(assignment)
    deadline_s = time.monotonic() + timeout_s
    while ends and time.monotonic() < deadline_s:
        message = consumer.poll(0.5)
        if message is None or message.error():
            continue
        where = (message.topic(), message.partition())
        if message.offset() + 1 >= ends.get(where, 0):
            ends.pop(where, None)
        yield message


def _earliest(found: dict[str, int], worker_id: str, timestamp_ms: int) -> None:
    if worker_id not in found or timestamp_ms < found[worker_id]:
        found[worker_id] = timestamp_ms


def read_stage_times(
    settings: DsecSettings, worker_ids: Collection[str], policy_name: str,
    timeout_s: float = 60.0,
) -> dict[str, StageTimes]:
    topics = topic_names(settings.topic_prefix)
    published: dict[str, int] = {}
    features: dict[str, int] = {}
    commands: dict[str, int] = {}
    consumer = Consumer(consumer_config(settings, f"{settings.topic_prefix}-reaction-trace"))
    try:
        for message in _read_to_end(
                consumer, [topics.metrics, topics.features, topics.actuations], timeout_s):
            _kind, timestamp_ms = message.timestamp()
            try:
                if message.topic() == topics.metrics:
                    batch = decode_metric_batch(message.value())
                    worker_id = batch.header.identity.worker_id
                    steps = batch.frames.get("step")
                    if steps is not None and steps["loss_nonfinite"].any():
                        _earliest(published, worker_id, timestamp_ms)
                elif message.topic() == topics.features:
                    event = decode(message.value(), FeatureEvent)
                    if event.features.get("loss_nonfinite_count", 0.0) > 0:
                        _earliest(features, event.identity.worker_id, timestamp_ms)
                else:
                    command = decode(message.value(), ActuationCommand)
                    if command.policy_name == policy_name:
                        _earliest(commands, command.target.worker_id, timestamp_ms)
            except DecodeError:
                continue  # not this bench's to judge
    finally:
        consumer.close()
    return {worker_id: StageTimes(published_ms=published.get(worker_id),
                                  features_ms=features.get(worker_id),
                                  command_ms=commands.get(worker_id))
            for worker_id in worker_ids}

"""Where each reaction trial's time went, read back from the topics after the trials.

Each message carries the wall-clock time its producer handed it over (Kafka's CreateTime):
the probe's flush holding the NaN step, the stream job's feature event counting it, the
policy engine's command to the worker. The earliest of each per worker is kept. The
topics are read whole, as they stand, by a bounded ``ConsumerLoop`` (every partition
assigned from the beginning, read to the end it had when the read began, nothing
committed).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Message

from dsec.bench.reaction_figures import StageTimes
from dsec.infra.consumer_loop import BatchWriter, ConsumerLoop, ConsumerLoopConfig, Start
from dsec.infra.kafka_clients import consumer_config
from dsec.schemas import ActuationCommand, DecodeError, decode, topic_names
from dsec.schemas.fast_decode import decode_metric_batch
from dsec.schemas.feature_columns import feature_events
from dsec.schemas.settings import DsecSettings
from dsec.schemas.topics import TopicNames

METADATA_TIMEOUT_S = 30.0
Sighting = tuple[str, str, int]  # (stage, worker id, CreateTime in epoch ms)


class TraceUnreadable(RuntimeError):
    """A message of the trial's topics could not be read."""


@dataclass
class StageSightings(BatchWriter[list[Sighting]]):
    """The earliest time each worker was seen at each stage."""

    topics: TopicNames
    policy_name: str
    earliest_ms: dict[str, dict[str, int]] = field(
        default_factory=lambda: {"published": {}, "features": {}, "command": {}})

    def prepare(self, messages: Sequence[Message]) -> list[Sighting]:
        sightings = []
        for message in messages:
            try:
                sightings += self._sightings(message)
            except DecodeError:
                continue  # not this bench's to judge
        return sightings

    def write(self, batch: list[Sighting]) -> None:
        for stage, worker_id, timestamp_ms in batch:
            found = self.earliest_ms[stage]
            if worker_id not in found or timestamp_ms < found[worker_id]:
                found[worker_id] = timestamp_ms

    def _sightings(self, message: Message) -> list[Sighting]:
        _kind, timestamp_ms = message.timestamp()
        if message.topic() == self.topics.metrics:
            batch = decode_metric_batch(message.value())
            steps = batch.frames.get("step")
            if steps is not None and steps["loss_nonfinite"].any():
                return [("published", batch.header.identity.worker_id, timestamp_ms)]
        elif message.topic() == self.topics.features:
            return [("features", event.identity.worker_id, timestamp_ms)
                    for event in feature_events(message.value())
                    if event.features.get("loss_nonfinite_count", 0.0) > 0]
        else:
            command = decode(message.value(), ActuationCommand)
            if command.policy_name == self.policy_name:
                return [("command", command.target.worker_id, timestamp_ms)]
        return []


def _unreadable(message: Message, reason: str) -> None:
    raise TraceUnreadable(f"{message.topic()}@{message.partition()}:{message.offset()}: "
                          f"{reason}")


def read_stage_times(
    settings: DsecSettings, worker_ids: Collection[str], policy_name: str,
    timeout_s: float = 60.0, consumer_factory: Callable[[dict], Any] = Consumer,
) -> dict[str, StageTimes]:
    """Each worker's earliest time at each stage; what ``timeout_s`` cut short is absent."""
    topics = topic_names(settings.topic_prefix)
    group = f"{settings.topic_prefix}-reaction-trace"  # assigned: never joins it
    sightings = StageSightings(topics, policy_name)
    loop = ConsumerLoop(
        ConsumerLoopConfig((topics.metrics, topics.features, topics.actuations), group,
                           poll_timeout_s=0.5, start=Start.BEGINNING, assign=True,
                           until_end=True, commit=False, metadata_timeout_s=METADATA_TIMEOUT_S),
        consumer_config(settings, group), sightings, _unreadable, service="reaction-trace",
        consumer_factory=consumer_factory)
    loop.run(timeout_s=timeout_s)
    published, features, commands = (sightings.earliest_ms[stage]
                                     for stage in ("published", "features", "command"))
    return {worker_id: StageTimes(published_ms=published.get(worker_id),
                                  features_ms=features.get(worker_id),
                                  command_ms=commands.get(worker_id))
            for worker_id in worker_ids}

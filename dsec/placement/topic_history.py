"""What placement knows, read from the compacted topics instead of the store: the latest
GPU personalities, workload affinity, GPU health and topology, for a deployment (or an
experiment arm) that runs the personality job without a sink.

Each read is bounded: every partition from the beginning to the end it had when the read
began, nothing committed. A record that does not decode is skipped with a warning; the
rest of the history stands.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence

from confluent_kafka import Message

from dsec.infra.consumer_loop import (
    BatchWriter,
    ConsumerLoop,
    ConsumerLoopConfig,
    OutputUnavailable,
    Start,
)
from dsec.infra.kafka_clients import consumer_config
from dsec.placement.history import PlacementEvent, PlacementHistory, history_from_events
from dsec.schemas import DecodeError, decode, topic_names
from dsec.schemas.alerts import GpuHealthEvent
from dsec.schemas.placement import GpuPersonalityEvent, GpuTopologyEvent, WorkloadAffinityEvent
from dsec.schemas.settings import DsecSettings
from dsec.schemas.topics import TopicNames

__all__ = ["GROUP_PREFIX", "history_topics", "read_topic_history", "topic_history"]

log = logging.getLogger(__name__)

# The consumer is assigned its partitions and never joins or commits to its group, but
# the broker still checks the name against the user's group ACLs: the placement user's.
GROUP_PREFIX = "dsec-placement-reader-history"


class _Events(BatchWriter[Sequence[Message]]):
    def __init__(self, models: dict[str, type]) -> None:
        self._models = models
        self.events: list[PlacementEvent] = []

    def write(self, batch: Sequence[Message]) -> None:
        for message in batch:
            if message.value() is None:  # a compaction tombstone
                continue
            try:
                self.events.append(decode(message.value(), self._models[message.topic()]))
            except DecodeError as exc:
                log.warning("placement: skipping %s@%d: %s", message.topic(),
                            message.offset(), exc.reason)


def _skip(_message: Message, _reason: str) -> None:
    """A record that cannot be read is skipped (logged where it was read)."""


def history_topics(topics: TopicNames) -> dict[str, type]:
    """The topics the history is read from, and their events' models."""
    return {topics.gpu_personalities: GpuPersonalityEvent,
            topics.workload_affinity: WorkloadAffinityEvent,
            topics.gpu_health: GpuHealthEvent, topics.gpu_topology: GpuTopologyEvent}


def read_topic_history(settings: DsecSettings, timeout_s: float = 30.0) -> PlacementHistory:
    """The history as the placement topics hold it now; ``OutputUnavailable`` when they
    were not read to their ends in ``timeout_s``."""
    models = history_topics(topic_names(settings.topic_prefix))
    group = f"{GROUP_PREFIX}-{uuid.uuid4().hex[:8]}"
    read = _Events(models)
    loop = ConsumerLoop(
        ConsumerLoopConfig(tuple(models), group, poll_timeout_s=0.2, start=Start.BEGINNING,
                           assign=True, until_end=True, commit=False,
                           metadata_timeout_s=timeout_s),
        consumer_config(settings, group), read, _skip, service="placement-history")
    if not loop.run(timeout_s=timeout_s):
        raise OutputUnavailable(f"the placement topics were not read to their ends in "
                                f"{timeout_s:.0f} s")
    return history_from_events(read.events)


def topic_history(settings: DsecSettings,
                  timeout_s: float = 30.0) -> Callable[[], PlacementHistory]:
    """A ``HistorySource`` loader over the topics."""
    return lambda: read_topic_history(settings, timeout_s)

"""The personality service: worker features and GPU profiles in; GPU personalities and
workload affinity out, on their compacted topics (and so, through the sink, to ClickHouse).

One ``ConsumerLoop`` over the features and GPU-profiles topics drives a
``PersonalityJob``. When the loop starts, the job's counters are read back from the
personality and affinity topics and the leak rates from the GPU-profiles topic (all
compacted), so a restart goes on from where the last run published. An undecodable
message is dead-lettered with the reason and the loop goes on; a batch's changes are
published before its offsets are committed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from confluent_kafka import Message, Producer

from dsec.infra.consumer_loop import (
    BatchWriter,
    ConsumerLoop,
    ConsumerLoopConfig,
    FailedMessages,
)
from dsec.infra.dead_letter_producer import DeadLetterProducer
from dsec.infra.durable_publish import publish_durably
from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.observability.metrics import EVENTS_IN, EVENTS_OUT, ProcessMetrics
from dsec.schemas import (
    DeadLetter,
    DecodeError,
    FeatureEvent,
    GpuProfileEvent,
    decode,
    encode,
    topic_names,
)
from dsec.schemas.feature_columns import feature_events
from dsec.schemas.placement import GpuPersonalityEvent, WorkloadAffinityEvent
from dsec.schemas.settings import DsecSettings
from dsec.services.restored_loop import RestoredLoopService, read_to_end
from dsec.stream_jobs.personality import PersonalityConfig, PersonalityJob

__all__ = ["SERVICE", "PersonalityService"]

log = logging.getLogger(__name__)
SERVICE = "placement"


class PersonalityService(RestoredLoopService, BatchWriter[Sequence[Message]]):
    thread_name = "dsec-placement"
    not_running = "the personality service is not running"

    def __init__(self, settings: DsecSettings, metrics: ProcessMetrics | None = None,
                 config: PersonalityConfig | None = None) -> None:
        self._settings = settings
        self.topics = topics = topic_names(settings.topic_prefix)
        metrics = metrics or ProcessMetrics()
        self._config = config
        self.job = PersonalityJob(config)
        self._stop = threading.Event()
        self._producer = Producer(producer_config(settings, "dsec-placement"))
        self._dead_letters = DeadLetterProducer(
            producer_config(settings, "dsec-placement-dead-letters"), topics.dead_letters,
            SERVICE, metrics)
        self._in = metrics.counter(EVENTS_IN)
        self._out = metrics.counter(EVENTS_OUT)
        group = f"{settings.topic_prefix}-placement"
        self._loop = ConsumerLoop(
            ConsumerLoopConfig((topics.features, topics.gpu_profiles), group,
                               poll_timeout_s=0.2),
            consumer_config(settings, group), self, self._dead_letter, service=SERVICE,
            metrics=metrics, stop=self._stop)
        metrics.add_health_check(SERVICE, self.health)

    def restore(self, timeout_s: float = 60.0) -> None:
        """The job from what its own topics and the GPU-profiles topic hold now."""
        read = _History(self.topics)
        read_to_end(self._settings, (self.topics.gpu_personalities,
                                     self.topics.workload_affinity, self.topics.gpu_profiles),
                    read, group_prefix="dsec-placement-reader", service=SERVICE,
                    what="the placement topics", timeout_s=timeout_s)
        self.job = PersonalityJob(self._config)
        self.job.restore(read.history)
        for profile in read.profiles:
            self.job.add_profile(profile)
        self.job.take_changes(0)  # what was read back is published already

    def write(self, batch: Sequence[Message]) -> None:
        failures: list[tuple[Message, str]] = []
        latest_ms = 0
        for message in batch:
            topic = message.topic()
            self._in.labels(SERVICE, topic).inc()
            try:
                events: list[FeatureEvent | GpuProfileEvent] = (
                    [*feature_events(message.value())] if topic == self.topics.features
                    else [decode(message.value(), GpuProfileEvent)])
            except DecodeError as exc:
                failures.append((message, exc.reason))
                continue
            for event in events:
                latest_ms = max(latest_ms, event.event_time_ms)
                if isinstance(event, FeatureEvent):
                    self.job.add_features(event)
                else:
                    self.job.add_profile(event)
        # Stamped with the input's time, so a replay derives the same history.
        self._publish(self.job.take_changes(latest_ms))
        if failures:
            raise FailedMessages(failures)

    def _publish(self, changes: list[GpuPersonalityEvent | WorkloadAffinityEvent]) -> None:
        messages = [((self.topics.gpu_personalities if isinstance(change, GpuPersonalityEvent)
                      else self.topics.workload_affinity), change.key().encode(), encode(change))
                    for change in changes]
        publish_durably(self._producer, messages, "personalities")
        for topic, _key, _value in messages:
            self._out.labels(SERVICE, topic).inc()

    def _dead_letter(self, message: Message, reason: str) -> None:
        self._dead_letters.publish([DeadLetter.for_message(
            topic=message.topic(), partition=message.partition(), offset=message.offset(),
            reason=reason, payload=message.value())])


class _History(BatchWriter[Sequence[Message]]):
    """What a bounded read of the placement topics and GPU profiles found."""

    def __init__(self, topics) -> None:
        self._topics = topics
        self.history: list[GpuPersonalityEvent | WorkloadAffinityEvent] = []
        self.profiles: list[GpuProfileEvent] = []

    def write(self, batch: Sequence[Message]) -> None:
        models = {self._topics.gpu_personalities: GpuPersonalityEvent,
                  self._topics.workload_affinity: WorkloadAffinityEvent,
                  self._topics.gpu_profiles: GpuProfileEvent}
        for message in batch:
            if message.value() is None:
                continue
            try:
                event = decode(message.value(), models[message.topic()])
            except DecodeError as exc:
                log.warning("placement: skipping %s@%d: %s", message.topic(),
                            message.offset(), exc.reason)
                continue
            if isinstance(event, GpuProfileEvent):
                self.profiles.append(event)
            else:
                self.history.append(event)

"""Dead letters published from a hand-written consumer, durable before the caller goes on:
a consumer records or commits the offsets of what it dead-lettered only after ``publish``
returned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from confluent_kafka import KafkaError, Message, Producer

from dsec.infra.consumer_loop import OutputUnavailable
from dsec.infra.observability.metrics import EVENTS_OUT, ProcessMetrics
from dsec.schemas import DeadLetter, encode


class DeadLetterPublisher(Protocol):
    """Where a consumer's dead letters go: ``publish`` returns once they are durable."""

    topic: str

    def publish(self, letters: Sequence[DeadLetter]) -> None: ...

    def close(self, timeout_s: float, release: bool = True) -> None: ...


class DeadLetterProducer:
    """``producer_config``: from ``dsec.infra.kafka_clients.producer_config`` (idempotent,
    ``acks=all``). Each letter is keyed by its source topic."""

    def __init__(self, producer_config: dict, topic: str, service: str,
                 metrics: ProcessMetrics, flush_timeout_s: float = 60.0) -> None:
        self.topic = topic
        self._producer = Producer(producer_config)
        self._closed = False
        self._flush_timeout_s = flush_timeout_s
        self._out = metrics.counter(EVENTS_OUT).labels(service, topic)

    def publish(self, letters: Sequence[DeadLetter]) -> None:
        """Returns once every letter is on the topic; raises ``OutputUnavailable`` else."""
        failures: list[str] = []

        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                failures.append(str(error))

        for letter in letters:
            self._producer.produce(self.topic, key=letter.source_topic.encode(),
                                   value=encode(letter), on_delivery=delivered)
        remaining = self._producer.flush(self._flush_timeout_s)
        if remaining or failures:
            raise OutputUnavailable(
                f"dead letters not delivered: {remaining} pending, {failures}")
        self._out.inc(len(letters))

    def close(self, timeout_s: float, release: bool = True) -> None:
        """Delivers what is held; with ``release``, lets go of the client (one left to the
        garbage collector keeps reconnecting to a broker that is gone, from threads of
        its own). Without it, a caller that may still publish keeps it."""
        if self._closed:
            return
        self._producer.flush(timeout_s)
        if release:
            self._closed = True
            self._producer.close()

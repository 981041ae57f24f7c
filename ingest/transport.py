"""Where a probe's messages go: the seam between the probe and Kafka."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from confluent_kafka import KafkaError, Producer

DeliveryCallback = Callable[[bool, str], None]  # (delivered, error text)


class Transport(Protocol):
    def send(self, topic: str, key: bytes, value: bytes, on_delivery: DeliveryCallback) -> bool:
        """Queues one message without blocking; False when the local queue is full."""

    def poll(self) -> None:
        """Serves delivery callbacks; never blocks."""

    def flush(self, timeout_s: float) -> int:
        """Waits up to ``timeout_s`` for queued messages; returns how many are left."""


class KafkaTransport:
    """confluent-kafka producer: idempotent, ``acks=all``, bounded local queue."""

    def __init__(self, config: dict) -> None:
        self._producer = Producer(config)

    def send(self, topic: str, key: bytes, value: bytes, on_delivery: DeliveryCallback) -> bool:
        def report(err: KafkaError | None, _msg: object) -> None:
            on_delivery(err is None, "" if err is None else str(err))

        try:
            self._producer.produce(topic, value=value, key=key, on_delivery=report)
        except BufferError:
            return False
        return True

    def poll(self) -> None:
        self._producer.poll(0)

    def flush(self, timeout_s: float) -> int:
        return int(self._producer.flush(timeout_s))

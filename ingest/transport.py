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

    def close(self) -> None:
        """Lets go of the connection without waiting: what is still queued is reported
        as not delivered."""


class KafkaTransport:
    """confluent-kafka producer: idempotent, ``acks=all``, bounded local queue."""

    def __init__(self, config: dict) -> None:
        self._producer = Producer(config)
        self._closed = False

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

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # A producer left to the garbage collector keeps reconnecting to a broker that is
        # gone, from threads of its own, for as long as the process lives.
        self._producer.purge()
        self._producer.poll(0)  # the purged messages' reports: counted as not delivered
        self._producer.close()

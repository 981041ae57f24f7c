"""Publishes accepted batches to Kafka and lets an HTTP handler await their delivery."""

from __future__ import annotations

import asyncio
import threading
from typing import Protocol

from confluent_kafka import KafkaError, Producer

from dsec.infra.observability.metrics import EVENTS_OUT, ProcessMetrics


class PublishError(RuntimeError):
    """The batch did not reach Kafka; ``retry`` says whether the caller should try again."""

    def __init__(self, message: str, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


class BatchPublisher(Protocol):
    async def publish(self, key: bytes, value: bytes) -> None:
        """Returns once the broker has the message; raises ``PublishError`` otherwise."""


class KafkaBatchPublisher:
    def __init__(self, producer_config: dict, topic: str, timeout_s: float,
                 metrics: ProcessMetrics | None = None,
                 health_name: str = "kafka-publisher") -> None:
        self._producer = Producer(producer_config)
        self._topic = topic
        self._timeout_s = timeout_s
        metrics = metrics or ProcessMetrics()
        self._published = metrics.counter(EVENTS_OUT).labels("ingest-gateway", topic)
        metrics.add_health_check(health_name, self.health)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="dsec-gateway-kafka", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.1)

    async def publish(self, key: bytes, value: bytes) -> None:
        loop = asyncio.get_running_loop()
        delivered: asyncio.Future[None] = loop.create_future()

        def settle(error: KafkaError | None) -> None:
            if delivered.done():
                return
            if error is None:
                delivered.set_result(None)
            else:
                delivered.set_exception(PublishError(str(error)))

        def on_delivery(error: KafkaError | None, _message: object) -> None:
            loop.call_soon_threadsafe(settle, error)

        try:
            self._producer.produce(self._topic, value=value, key=key, on_delivery=on_delivery)
        except BufferError:
            raise PublishError("the gateway's Kafka queue is full") from None
        try:
            await asyncio.wait_for(delivered, self._timeout_s)
        except TimeoutError:
            raise PublishError(f"Kafka did not acknowledge within {self._timeout_s} s") from None
        self._published.inc()

    def health(self) -> str | None:
        if not self._thread.is_alive():
            return "the Kafka delivery thread is not running"
        return None

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.flush(timeout_s)

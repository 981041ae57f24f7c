"""Messages published from a hand-written consumer, durable before its offsets are
committed: ``publish_durably`` returns once every one is on its topic."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaError, Message, Producer

from dsec.infra.consumer_loop import OutputUnavailable

__all__ = ["publish_durably"]


def publish_durably(producer: Producer, messages: Iterable[tuple[str, bytes, bytes]],
                    what: str, timeout_s: float = 30.0) -> int:
    """Produces each ``(topic, key, value)`` and flushes; raises ``OutputUnavailable``
    (the loop ends and its batch is handed again) when any was not delivered. Returns how
    many were published."""
    errors: list[str] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            errors.append(str(error))

    count = 0
    for topic, key, value in messages:
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
        count += 1
    if count == 0:
        return 0
    left = producer.flush(timeout_s)
    if left or errors:
        raise OutputUnavailable(f"{what} not delivered: {left} pending, {errors}")
    return count

"""What a stream stage reads and what it asks to be published, free of any Kafka client:
the stages take ``Record``s and give ``Output``s, and the adapters move them to and from
the broker."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from dsec.schemas import DeadLetter, encode

__all__ = ["Output", "Record"]


@dataclass(frozen=True, slots=True)
class Record:
    """One consumed message, with where it came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    def dead_letter(self, reason: str) -> DeadLetter:
        """The dead letter for this message, with its origin."""
        return DeadLetter.for_message(topic=self.topic, partition=self.partition,
                                      offset=self.offset, reason=reason, payload=self.value)


@dataclass(frozen=True, slots=True)
class Output:
    """A model (an event, a signed policy) to publish on ``topic`` under ``key``;
    ``encoded``: its wire bytes, where the stage has them already."""

    topic: str
    key: bytes
    event: BaseModel
    encoded: bytes | None = None

    def value(self) -> bytes:
        return self.encoded if self.encoded is not None else encode(self.event)

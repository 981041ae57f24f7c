"""Stream-job batches are acknowledged only after their processing finished: Faust's
``take_events`` acks in a ``finally``, which would commit a batch whose processing failed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from faust.types.tuples import Message

from dsec.stream_jobs.faust_app import durable_batches


class _Consumer:
    def __init__(self) -> None:
        self.committable: list[int] = []


class _Stream:
    """``take_events``' acknowledgement as Faust has it: every event of a batch is acked
    when the consumer of the batch resumes the generator or abandons it."""

    def __init__(self, batches: list[list[Message]], consumer: _Consumer) -> None:
        self._batches = batches
        self._consumer = consumer

    async def take_events(self, max_events: int, within: float):
        for messages in self._batches:
            events = [SimpleNamespace(message=m) for m in messages]
            try:
                yield events
            finally:
                for event in events:
                    if event.message.ack(self._consumer):
                        self._consumer.committable.append(event.message.offset)


def _messages(offsets: range) -> list[Message]:
    messages = []
    for offset in offsets:
        message = Message("metrics", 0, offset, 0.0, 0, None, None, b"k", b"v", 0)
        message.incref()  # the stream's own reference, as the conductor gives it
        messages.append(message)
    return messages


def test_a_batch_is_committable_once_processed_and_not_when_processing_failed() -> None:
    consumer = _Consumer()
    stream = _Stream([_messages(range(0, 3)), _messages(range(3, 6))], consumer)

    async def run() -> None:
        async for batch in durable_batches(stream, 500, 0.05):
            if batch[0].message.offset == 3:
                raise RuntimeError("processing failed")

    with pytest.raises(RuntimeError):
        asyncio.run(run())
    assert consumer.committable == [0, 1, 2]

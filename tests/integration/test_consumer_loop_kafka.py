"""The ConsumerLoop on the real broker: a writer that dies before its output is durable
leaves the batch to the next loop of the group, and a poison message is dead-lettered
while the loop goes on."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer

from dsec.infra.consumer_loop import (
    BatchWriter,
    ConsumerLoop,
    ConsumerLoopConfig,
    OutputUnavailable,
)
from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.topics import ensure_topics
from dsec.schemas import topic_names

SAFETY_S = 120.0


class Collect(BatchWriter[list]):
    def __init__(self, last: bytes, die_after: int | None = None) -> None:
        self.written: list[bytes] = []
        self.loop: ConsumerLoop | None = None
        self._last = last
        self._die_after = die_after

    def write(self, batch: list) -> None:
        values = [m.value() for m in batch]
        if b"poison" in values:
            raise ValueError("poison")
        if self._die_after is not None and len(self.written) + len(values) > self._die_after:
            raise OutputUnavailable("the writer died before its output was durable")
        self.written += values
        if self._last in values:
            assert self.loop is not None
            self.loop.stop()


def _loop(settings, topic: str, group: str, writer: Collect, letters: list) -> ConsumerLoop:
    loop = ConsumerLoop(ConsumerLoopConfig((topic,), group, batch_max_messages=5),
                        consumer_config(settings, group), writer,
                        lambda message, reason: letters.append((message.value(), reason)),
                        service="test-loop")
    writer.loop = loop
    return loop


def test_commit_after_durable_and_poison_survival(settings) -> None:
    topic = topic_names(settings.topic_prefix).metrics
    ensure_topics(settings, partitions=1)
    producer = Producer(producer_config(settings, "test-loop"))
    values = [b"m%02d" % n for n in range(20)]
    values.insert(7, b"poison")
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0
    group = f"loop-{uuid.uuid4().hex[:8]}"
    letters: list = []

    dying = Collect(last=values[-1], die_after=10)
    try:
        _loop(settings, topic, group, dying, letters).run(timeout_s=SAFETY_S)
        raise AssertionError("the writer was to die")
    except OutputUnavailable:
        pass
    assert len(dying.written) <= 10 and letters == [(b"poison", letters[0][1])]
    assert "ValueError: poison" in letters[0][1]

    after = Collect(last=values[-1])
    assert _loop(settings, topic, group, after, letters).run(timeout_s=SAFETY_S)
    # Nothing lost: what the dead writer had not made durable came to its successor, in
    # order (a message written but not committed before the death may come twice).
    healthy = [v for v in values if v != b"poison"]
    assert set(dying.written) | set(after.written) == set(healthy)
    assert after.written == healthy[healthy.index(after.written[0]):]
    assert after.written[0] in dying.written or after.written[0] == healthy[len(dying.written)]

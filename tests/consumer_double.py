"""A test double of the confluent-kafka ``Consumer`` API, in memory, for the control flow of
``dsec.infra.consumer_loop`` without a broker: only what the loop calls, one group member."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    TopicPartition,
)


@dataclass
class InMemoryMessage:
    """What ``Consumer.consume`` returns, for the methods the loop reads."""

    _topic: str
    _partition: int
    _offset: int
    _value: bytes | None
    _key: bytes | None = None
    _timestamp_ms: int = 0

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, self._timestamp_ms


@dataclass
class InMemoryLog:
    """Topics as lists of partitions of values, and the groups' committed offsets."""

    topics: dict[str, list[list[bytes | None]]] = field(default_factory=dict)
    keys: dict[tuple[str, int, int], bytes] = field(default_factory=dict)
    committed: dict[tuple[str, str, int], int] = field(default_factory=dict)
    commits: list[dict[tuple[str, int], int]] = field(default_factory=list)
    timestamps_ms: dict[tuple[str, int, int], int] = field(default_factory=dict)

    def append(self, topic: str, value: bytes | None, partition: int = 0,
               partitions: int = 1, key: bytes | None = None,
               timestamp_ms: int = 0) -> None:
        """``timestamp_ms``: the message's CreateTime."""
        values = self.topics.setdefault(topic, [[] for _ in range(partitions)])[partition]
        if key is not None:
            self.keys[(topic, partition, len(values))] = key
        self.timestamps_ms[(topic, partition, len(values))] = timestamp_ms
        values.append(value)

    def consumer(self, config: dict) -> InMemoryConsumer:
        """A ``consumer_factory`` for ``ConsumerLoop``."""
        return InMemoryConsumer(self, config)


class InMemoryConsumer:
    def __init__(self, log: InMemoryLog, config: dict) -> None:
        self._log = log
        self._group = config["group.id"]
        self._positions: dict[tuple[str, int], int] = {}
        self.closed = False

    def subscribe(self, topics: list[str], on_assign=None, on_revoke=None) -> None:
        partitions = [TopicPartition(topic, p, OFFSET_INVALID) for topic in topics
                      for p in range(len(self._log.topics.get(topic, [])))]
        if on_assign is not None:
            on_assign(self, partitions)
        else:
            self.assign(partitions)

    def assign(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            offset = tp.offset
            if offset in (OFFSET_STORED, OFFSET_INVALID):
                offset = self._log.committed.get((self._group, tp.topic, tp.partition), 0)
            elif offset == OFFSET_BEGINNING:
                offset = 0
            self._positions[(tp.topic, tp.partition)] = offset

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in self._positions]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition,
                               self._positions.get((tp.topic, tp.partition), -1001))
                for tp in partitions]

    def committed(self, partitions: list[TopicPartition],
                  timeout: float | None = None) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition,
                               self._log.committed.get((self._group, tp.topic, tp.partition),
                                                       OFFSET_INVALID))
                for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        return 0, len(self._log.topics[tp.topic][tp.partition])

    def list_topics(self, topic: str, timeout: float | None = None) -> SimpleNamespace:
        found = {}
        if topic in self._log.topics:
            found[topic] = SimpleNamespace(error=None, partitions={
                p: None for p in range(len(self._log.topics[topic]))})
        return SimpleNamespace(topics=found)

    def consume(self, num_messages: int, timeout: float) -> list[InMemoryMessage]:
        batch: list[InMemoryMessage] = []
        for (topic, partition), position in self._positions.items():
            values = self._log.topics[topic][partition]
            taken = values[position:position + num_messages - len(batch)]
            batch += [InMemoryMessage(topic, partition, position + n, value,
                                      self._log.keys.get((topic, partition, position + n)),
                                      self._log.timestamps_ms.get(
                                          (topic, partition, position + n), 0))
                      for n, value in enumerate(taken)]
            self._positions[(topic, partition)] = position + len(taken)
        if not batch:
            time.sleep(timeout)  # as the client waits for messages that are not there
        return batch

    def poll(self, timeout: float) -> InMemoryMessage | None:
        polled = self.consume(1, timeout)
        return polled[0] if polled else None

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        self._log.commits.append({(tp.topic, tp.partition): tp.offset for tp in offsets})
        for tp in offsets:
            self._log.committed[(self._group, tp.topic, tp.partition)] = tp.offset

    def close(self) -> None:
        self.closed = True

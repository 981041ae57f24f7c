"""What a ``ConsumerLoop`` is configured with and hands back: its configuration, the
writer it calls, the exceptions a writer raises, its counters (see ``consumer_loop``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from confluent_kafka import Message, TopicPartition

Batch = TypeVar("Batch")
PartitionKey = tuple[str, int]
DeadLetter = Callable[[Message, str], None]
StartingOffsets = Callable[[list[TopicPartition]], Mapping[PartitionKey, int]]
HANDLER_FAILED = "handler_failed"  # the reason class of a message the writer failed on


class Start(Enum):
    """Where a partition without a starting offset of the caller's begins."""

    COMMITTED = "committed"  # the group's committed offset (else ``auto.offset.reset``)
    BEGINNING = "beginning"
    # The end as read when the partitions are taken, so that what is produced once the loop
    # has its partitions (``wait_assigned``) is read, and nothing before.
    END = "end"


@dataclass(frozen=True)
class ConsumerLoopConfig:
    """``assign``: take every partition of ``topics`` (no group rebalancing) instead of
    subscribing. ``until_end``: ``run`` returns once every partition reached the end it had
    at assignment (needs ``assign``). ``overlap_writes``: the next batch is polled and
    prepared while the one before is written, on a thread of its own. ``return_on_first``:
    a round ends as soon as one message has come, with what has been fetched already
    beside it, rather than once the batch is full or ``poll_timeout_s`` has passed: for a
    consumer whose latency matters more than the size of its batches."""

    topics: tuple[str, ...]
    group_id: str
    poll_timeout_s: float = 0.1
    batch_max_messages: int = 500
    start: Start = Start.COMMITTED
    assign: bool = False
    until_end: bool = False
    commit: bool = True
    overlap_writes: bool = False
    return_on_first: bool = False
    lag_interval_s: float = 5.0
    stalled_after_s: float = 120.0
    metadata_timeout_s: float = 30.0
    dead_letter_reason: str = HANDLER_FAILED

    def __post_init__(self) -> None:
        if not self.topics:
            raise ValueError("a consumer loop needs at least one topic")
        if self.until_end and not self.assign:
            raise ValueError("until_end reads assigned partitions: set assign=True")
        if self.batch_max_messages < 1 or self.poll_timeout_s < 0:
            raise ValueError("batch_max_messages must be >= 1 and poll_timeout_s >= 0")


class OutputUnavailable(Exception):
    """The output cannot be made durable now for a reason not in the input (a store or a
    broker gone): the loop ends without dead-lettering or committing the batch."""


class FailedMessages(Exception):
    """The batch was handled but for ``failures`` (each message with why it failed): the
    loop dead-letters those and tries none of the batch again."""

    def __init__(self, failures: Sequence[tuple[Message, str]]) -> None:
        super().__init__(f"{len(failures)} message(s) of the batch failed")
        self.failures = list(failures)


class TopicMissing(LookupError):
    """An assigned loop's topic does not exist (or its metadata carries an error)."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"no topic {topic}")
        self.topic = topic


class BatchWriter(ABC, Generic[Batch]):
    """Where a loop's batches go: ``write`` returns once the batch's output is durable."""

    def prepare(self, messages: Sequence[Message]) -> Batch:
        """Turns polled messages (errors left out) into what ``write`` takes."""
        return messages  # type: ignore[return-value]

    @abstractmethod
    def write(self, batch: Batch) -> None:
        """Makes the batch's output durable; raising leaves its offsets uncommitted."""


@dataclass
class LoopStats:
    messages: int = 0
    batches: int = 0
    dead_lettered: int = 0
    commits: int = 0
    commit_failures: int = 0
    client_errors: int = 0


def consumer_lag(end_offset: int, position: int) -> int | None:
    """Messages between ``position`` and ``end_offset``; None while either is unknown
    (librdkafka's negative logical offsets)."""
    if end_offset < 0 or position < 0:
        return None
    return max(0, end_offset - position)


def failure_reason(exc: BaseException, limit: int = 1000) -> str:
    return f"{type(exc).__name__}: {exc}"[:limit]

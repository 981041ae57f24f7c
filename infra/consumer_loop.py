"""One poll loop under dsec's hand-written confluent-kafka consumers.

A ``ConsumerLoop`` owns its ``Consumer``: it polls batches, hands them to a ``BatchWriter``,
and commits a batch's offsets only once the writer's ``write`` has returned, that is once
the batch's output is durable. It reports consumer lag, comes round often enough to be
watched for liveness, and stops cleanly: what is durable is committed, the client closed.

No input ends the loop. When ``prepare`` or ``write`` raises on a batch, the batch's
messages are tried again one at a time, and a message that still fails goes to the
caller's dead-letter callback with the reason, is counted, and the loop goes on. A writer
whose output cannot be written twice (a command applied, a webhook called) handles each
message on its own and raises ``FailedMessages`` naming the ones that failed: those are
dead-lettered, and nothing of the batch is tried again.
Only ``OutputUnavailable`` (the output cannot be made durable now, whatever the input),
a dead-letter callback that raises, or the client itself ends the loop, with nothing of
the failed batch committed: a new loop (``LoopSupervisor`` starts one) is handed it again.

Public API:

- ``ConsumerLoopConfig``: topics, group, how partitions are taken (group ``subscribe`` or
  ``assign`` of every partition), where they start (the committed offset, the beginning,
  or the end as of assignment), batch size, poll timeout, whether a round ends at the
  first message, whether to commit, whether to stop at the end offsets seen at assignment
  (a bounded read).
- ``BatchWriter``: ``write(batch)`` returns once the batch's output is durable;
  ``prepare(messages)`` (optional) turns polled messages into that batch.
- ``DeadLetter`` callback: ``(message, reason) -> None``, returning once the dead letter
  is durable.
- ``OutputUnavailable``: what a writer raises when the fault is not in the input.
- ``FailedMessages``: what a writer raises when it handled a batch but for some messages.
- ``ConsumerLoop(config, client_config, writer, dead_letter, ...)``: ``run`` (blocking),
  ``stop``, ``down`` (for health checks), ``wait_assigned``, ``stats``,
  ``lag_by_partition``, ``end_offsets``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Generic

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_STORED,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from dsec.infra.consumer_loop_types import (
    HANDLER_FAILED,
    Batch,
    BatchWriter,
    ConsumerLoopConfig,
    DeadLetter,
    FailedMessages,
    LoopStats,
    OutputUnavailable,
    PartitionKey,
    Start,
    StartingOffsets,
    TopicMissing,
    consumer_lag,
    failure_reason,
)
from dsec.infra.observability.kafka import ConsumerLag
from dsec.infra.observability.metrics import EVENTS_DEAD_LETTERED, ProcessMetrics

__all__ = [
    "HANDLER_FAILED",
    "Batch",
    "BatchWriter",
    "ConsumerLoop",
    "ConsumerLoopConfig",
    "DeadLetter",
    "FailedMessages",
    "LoopStats",
    "OutputUnavailable",
    "PartitionKey",
    "Start",
    "StartingOffsets",
    "TopicMissing",
    "consumer_lag",
    "failure_reason",
]

log = logging.getLogger(__name__)



@dataclass
class _Pending:
    future: Future[None]
    messages: list[Message]
    offsets: dict[PartitionKey, int] = field(default_factory=dict)


class ConsumerLoop(Generic[Batch]):
    """Polls, writes, commits what is durable; see the module docstring."""

    def __init__(
        self,
        config: ConsumerLoopConfig,
        client_config: Mapping[str, Any],
        writer: BatchWriter[Batch],
        dead_letter: DeadLetter,
        *,
        service: str,
        metrics: ProcessMetrics | None = None,
        stop: threading.Event | None = None,
        starting_offsets: StartingOffsets | None = None,
        consumer_factory: Callable[[dict], Any] = Consumer,
    ) -> None:
        """``client_config``: from ``dsec.infra.kafka_clients.consumer_config`` (its
        ``group.id`` is ``config.group_id``). ``starting_offsets``: where assigned
        partitions start, by (topic, partition); the others start as ``config.start``.
        ``consumer_factory``: the client, ``confluent_kafka.Consumer`` but in tests."""
        self.config = config
        self._client_config = {**client_config, "group.id": config.group_id,
                               "enable.auto.commit": False}
        self._writer = writer
        self._dead_letter = dead_letter
        self._service = service
        self._stop = stop or threading.Event()
        self._starting_offsets = starting_offsets
        self._factory = consumer_factory
        self._lag = ConsumerLag(metrics, service) if metrics is not None else None
        self._dead_letter_counter = (
            metrics.counter(EVENTS_DEAD_LETTERED).labels(service, config.dead_letter_reason)
            if metrics is not None else None)
        self.stats = LoopStats()
        self.lag_by_partition: dict[PartitionKey, int] = {}
        self.end_offsets: dict[PartitionKey, int] = {}
        self.last_round_s: float | None = None
        self._consumer: Any = None
        self._pending: _Pending | None = None
        self._durable: dict[PartitionKey, int] = {}  # next offsets written, not committed
        self._next: dict[PartitionKey, int] = {}  # next offsets handed to the writer
        self._lag_due_s = 0.0
        self._assigned = threading.Event()

    @property
    def stop_event(self) -> threading.Event:
        return self._stop

    def stop(self) -> None:
        """Asks ``run`` to finish: it commits what is durable and closes the client."""
        self._stop.set()

    def wait_assigned(self, timeout_s: float) -> bool:
        """Waits until this run has taken its partitions (placed where they start); True
        once it has."""
        return self._assigned.wait(timeout_s)

    def down(self) -> str | None:
        """None while the loop comes round, else why it is not healthy."""
        if self.last_round_s is None:
            return f"{self._service}'s consumer loop has not started yet"
        silent_s = time.monotonic() - self.last_round_s
        if silent_s > self.config.stalled_after_s:
            return f"{self._service}'s consumer loop has not come round for {silent_s:.0f} s"
        return None

    def run(self, timeout_s: float | None = None) -> bool:
        """Runs until ``stop`` (or, ``until_end``, the end); False when ``timeout_s``
        passed first. Raises what ends the loop otherwise (see the module docstring)."""
        deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
        self.last_round_s = None
        self._assigned.clear()
        self._pending, self._durable, self._next = None, {}, {}
        consumer = self._factory(dict(self._client_config))
        self._consumer = consumer
        clean = False
        try:
            self._take_partitions(consumer)
            overlap = self.config.overlap_writes
            with (ThreadPoolExecutor(1, thread_name_prefix=f"dsec-{self._service}-writer")
                  if overlap else nullcontext()) as pool:
                reached = self._rounds(consumer, pool, deadline_s)
                self._finish_pending()
            clean = True
            return reached
        finally:
            try:
                if clean:
                    self._commit()
            finally:
                self._consumer = None
                consumer.close()

    def _rounds(self, consumer: Any, pool: ThreadPoolExecutor | None,
                deadline_s: float | None) -> bool:
        while not self._stop.is_set():
            self.last_round_s = time.monotonic()
            if self.config.until_end and self._at_end(consumer):
                return True
            if deadline_s is not None and self.last_round_s > deadline_s:
                return False
            messages = self._usable(self._poll(consumer))
            self._report_lag(consumer)
            if not messages:
                if self._pending is not None and self._pending.future.done():
                    self._finish_pending()
                    self._commit()
                continue
            self.stats.batches += 1
            self.stats.messages += len(messages)
            if pool is None:
                self._process(messages)
                self._mark_durable(messages)
            else:
                self._submit(pool, messages)
            self._commit()
        return True

    def _poll(self, consumer: Any) -> list[Message]:
        size, timeout_s = self.config.batch_max_messages, self.config.poll_timeout_s
        if not self.config.return_on_first:
            return consumer.consume(size, timeout_s) or []
        # consume() waits for a full batch or the timeout; poll() returns with the first.
        first = consumer.poll(timeout_s)
        if first is None:
            return []
        return [first, *(consumer.consume(size - 1, 0) if size > 1 else [])]

    def _usable(self, polled: list[Message]) -> list[Message]:
        """The polled messages to write: client errors logged and left out, and past the
        end offsets of a bounded read."""
        usable = []
        for message in polled:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    self.stats.client_errors += 1
                    log.warning("%s: %s", self._service, error)
                continue
            key = (message.topic(), message.partition())
            end = self.end_offsets.get(key)
            if self.config.until_end and end is not None and message.offset() >= end:
                continue
            self._next[key] = message.offset() + 1
            usable.append(message)
        return usable

    def _submit(self, pool: ThreadPoolExecutor, messages: list[Message]) -> None:
        try:
            batch = self._writer.prepare(messages)
        except OutputUnavailable:
            raise
        except Exception as exc:
            log.warning("%s: a batch could not be prepared (%s); one message at a time",
                        self._service, failure_reason(exc))
            self._finish_pending()
            self._one_at_a_time(messages)
            self._mark_durable(messages)
            return
        self._finish_pending()
        self._pending = _Pending(pool.submit(self._writer.write, batch), messages)

    def _finish_pending(self) -> None:
        """Waits for the batch being written; its offsets are durable after."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.future.result()
        except OutputUnavailable:
            raise
        except FailedMessages as failed:
            self._dead_letter_each(failed)
        except Exception as exc:
            log.warning("%s: a batch could not be written (%s); one message at a time",
                        self._service, failure_reason(exc))
            self._one_at_a_time(pending.messages)
        self._mark_durable(pending.messages)

    def _process(self, messages: list[Message]) -> None:
        try:
            self._writer.write(self._writer.prepare(messages))
        except OutputUnavailable:
            raise
        except FailedMessages as failed:
            self._dead_letter_each(failed)
        except Exception as exc:
            if len(messages) == 1:
                self._send_to_dead_letters(messages[0], failure_reason(exc))
                return
            log.warning("%s: a batch could not be written (%s); one message at a time",
                        self._service, failure_reason(exc))
            self._one_at_a_time(messages)

    def _one_at_a_time(self, messages: list[Message]) -> None:
        for message in messages:
            try:
                self._writer.write(self._writer.prepare([message]))
            except OutputUnavailable:
                raise
            except FailedMessages as failed:
                self._dead_letter_each(failed)
            except Exception as exc:
                self._send_to_dead_letters(message, failure_reason(exc))

    def _dead_letter_each(self, failed: FailedMessages) -> None:
        for message, why in failed.failures:
            self._send_to_dead_letters(message, why)

    def _send_to_dead_letters(self, message: Message, why: str) -> None:
        reason = f"{self._service} could not handle it: {why}"
        log.warning("%s: %s@%d:%d dead-lettered: %s", self._service, message.topic(),
                    message.partition(), message.offset(), reason)
        self._dead_letter(message, reason)
        self.stats.dead_lettered += 1
        if self._dead_letter_counter is not None:
            self._dead_letter_counter.inc()

    def _mark_durable(self, messages: list[Message]) -> None:
        for message in messages:
            key = (message.topic(), message.partition())
            self._durable[key] = max(self._durable.get(key, 0), message.offset() + 1)

    def _commit(self) -> None:
        if not self.config.commit or not self._durable or self._consumer is None:
            return
        offsets = [TopicPartition(topic, partition, offset)
                   for (topic, partition), offset in self._durable.items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # Offsets not committed are read again by the partition's next owner: at least
            # once, never lost. The loop goes on; the next commit carries them again.
            self.stats.commit_failures += 1
            log.warning("%s: commit failed: %s", self._service, exc)
            return
        self.stats.commits += 1
        self._durable.clear()

    def _take_partitions(self, consumer: Any) -> None:
        if not self.config.assign:
            consumer.subscribe(list(self.config.topics), on_assign=self._on_assign,
                               on_revoke=self._on_revoke)
            return
        partitions = []
        for topic in self.config.topics:
            metadata = consumer.list_topics(
                topic, timeout=self.config.metadata_timeout_s).topics.get(topic)
            if metadata is None or metadata.error is not None:
                raise TopicMissing(topic)
            partitions += [TopicPartition(topic, p) for p in sorted(metadata.partitions)]
        self._place(consumer, partitions)
        if self.config.until_end:
            self._read_end_offsets(consumer, partitions)
        consumer.assign(partitions)
        self._assigned.set()

    def _place(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        stored = dict(self._starting_offsets(partitions)) if self._starting_offsets else {}
        unplaced = [tp for tp in partitions if (tp.topic, tp.partition) not in stored]
        if self.config.start is Start.END:
            stored.update({key: high for key, (_low, high)
                           in self._watermarks(consumer, unplaced).items()})
        elif self.config.start is Start.COMMITTED and self._resets_to_end() and unplaced:
            # A partition the group never committed starts at its end as read now, not as
            # librdkafka resolves "latest" on its first fetch: that lookup can come after a
            # message produced once ``wait_assigned`` returned, which would be skipped.
            committed = consumer.committed(
                [TopicPartition(tp.topic, tp.partition) for tp in unplaced],
                timeout=self.config.metadata_timeout_s)
            fresh = [tp for tp in committed if tp.offset < 0]
            stored.update({key: high for key, (_low, high)
                           in self._watermarks(consumer, fresh).items()})
        default = OFFSET_BEGINNING if self.config.start is Start.BEGINNING else OFFSET_STORED
        for tp in partitions:
            tp.offset = stored.get((tp.topic, tp.partition), default)

    def _resets_to_end(self) -> bool:
        reset = str(self._client_config.get("auto.offset.reset", "")).lower()
        return reset in ("latest", "largest", "end")

    def _read_end_offsets(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        for key, (low, high) in self._watermarks(consumer, partitions).items():
            self.end_offsets[key] = high
            if high <= low:
                self._next[key] = high

    def _watermarks(self, consumer: Any, partitions: list[TopicPartition]) -> dict[
            PartitionKey, tuple[int, int]]:
        """The low and high offsets of each partition now, asked again while the broker
        answers with an error (a loaded single broker briefly reports no leader)."""
        deadline_s = time.monotonic() + self.config.metadata_timeout_s
        marks = {}
        for tp in partitions:
            while True:
                try:
                    marks[(tp.topic, tp.partition)] = consumer.get_watermark_offsets(
                        TopicPartition(tp.topic, tp.partition),
                        timeout=self.config.metadata_timeout_s)
                    break
                except KafkaException:
                    if time.monotonic() > deadline_s:
                        raise
                    time.sleep(1.0)
        return marks

    def _at_end(self, consumer: Any) -> bool:
        positions = consumer.position([TopicPartition(t, p) for t, p in self.end_offsets])
        reached = {(tp.topic, tp.partition): tp.offset for tp in positions}
        return all(max(self._next.get(key, -1), reached.get(key, -1)) >= end
                   for key, end in self.end_offsets.items())

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._place(consumer, partitions)
        consumer.assign(partitions)
        self._assigned.set()

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        """What is durable is committed while the partitions are still this loop's."""
        self._finish_pending()
        self._commit()
        for tp in partitions:
            self._durable.pop((tp.topic, tp.partition), None)
            self._next.pop((tp.topic, tp.partition), None)

    def _report_lag(self, consumer: Any) -> None:
        now_s = time.monotonic()
        if now_s < self._lag_due_s:
            return
        self._lag_due_s = now_s + self.config.lag_interval_s
        lags: dict[PartitionKey, int] = {}
        for tp in consumer.position(consumer.assignment()):
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
            lag = consumer_lag(high, tp.offset)
            if lag is not None:
                lags[(tp.topic, tp.partition)] = lag
        self.lag_by_partition = lags
        if self._lag is not None:
            self._lag.report({(self._service, topic, str(partition)): lag
                              for (topic, partition), lag in lags.items()})

"""The ClickHouse sink: persists dsec's topics, committing offsets only after the write.

It is its own consumer group, and the only writer of the embedded store: a chDB
directory can be open in one process only, so every other component publishes to
Kafka. Nothing is stored twice:
- raw samples go column-wise (Arrow) into one table per sample kind;
- after each write, the next offsets are recorded in ClickHouse (``sink_offsets``)
  before they are committed to Kafka, and a restarted sink resumes from the record,
  so a crash between the write and the commit does not replay the batch;
- the smaller topics are deduplicated by event id (derived outputs of the stream
  jobs carry deterministic ids, so a replayed stream batch re-derives the same ids);
- every insert carries the hash of its events' ids as the deduplication token.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from pydantic import BaseModel
from tenacity import Retrying, stop_never, wait_exponential

from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    DeadLetter,
    DecodeError,
    FeatureEvent,
    GpuProfileEvent,
    PolicyDecision,
    decode,
)
from dsec.schemas.topics import TopicNames
from dsec.stream_jobs import rows
from dsec.stream_jobs.fast_decode import decode_metric_batch
from dsec.stream_jobs.raw_columns import RawColumnsBuilder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableRoute:
    table: str
    columns: list[str]
    model: type[BaseModel]
    to_rows: Callable[[Any], list[rows.Row]]
    id_of: Callable[[Any], str]
    id_column: str = "event_id"


def _event_id(event: Any) -> str:
    return event.event_id


def routes_for(topics: TopicNames) -> dict[str, TableRoute]:
    return {
        topics.features: TableRoute(
            "features", rows.FEATURE_COLUMNS, FeatureEvent, rows.feature_rows, _event_id),
        topics.gpu_profiles: TableRoute(
            "gpu_profiles", rows.GPU_PROFILE_COLUMNS, GpuProfileEvent, rows.gpu_profile_rows,
            _event_id),
        topics.actuations: TableRoute(
            "actuations", rows.ACTUATION_COLUMNS, ActuationCommand, rows.actuation_rows,
            lambda command: command.actuation_id, id_column="actuation_id"),
        topics.actuation_results: TableRoute(
            "actuation_results", rows.RESULT_COLUMNS, ActuationResult, rows.result_rows,
            _event_id),
        topics.decisions: TableRoute(
            "policy_decisions", rows.DECISION_COLUMNS, PolicyDecision, rows.decision_rows,
            _event_id),
        topics.dead_letters: TableRoute(
            "dead_letters", rows.DEAD_LETTER_COLUMNS, DeadLetter, rows.dead_letter_rows,
            _event_id),
    }


class _RecentIds:
    """A bounded set of recently stored ids, oldest forgotten first."""

    def __init__(self, capacity: int) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self.capacity = capacity

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._ids

    def add(self, event_id: str) -> None:
        self._ids[event_id] = None
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)


@dataclass
class PreparedBatch:
    """A consumed batch, decoded: what each table receives, and where the next one starts.
    Each table's deduplication token hashes the ids of the events it holds."""

    arrow: dict[str, Any] = field(default_factory=dict)
    rows: dict[str, list[rows.Row]] = field(default_factory=dict)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    tokens: dict[str, Any] = field(default_factory=dict)

    def token(self, table: str) -> Any:
        return self.tokens.setdefault(table, hashlib.blake2b(digest_size=16))

    def commit_offsets(self) -> list[TopicPartition]:
        return [TopicPartition(topic, partition, offset)
                for (topic, partition), offset in self.next_offsets.items()]


@dataclass
class SinkCounters:
    messages: int = 0
    samples: int = 0
    rows_by_table: dict[str, int] = field(default_factory=dict)
    duplicates_skipped: int = 0
    undecodable: int = 0
    insert_retries: int = 0


class ClickHouseSink:
    def __init__(
        self,
        client: Client,
        client_lock: threading.Lock,
        consumer_config: dict,
        topics: TopicNames,
        batch_max_messages: int = 2000,
        poll_timeout_s: float = 0.1,
        remember_ids: int = 200_000,
    ) -> None:
        self._client = client
        self._client_lock = client_lock
        self._consumer_config = consumer_config
        self._group = str(consumer_config["group.id"])
        self._metrics_topic = topics.metrics
        self._routes = routes_for(topics)
        self._tables = {route.table: route for route in self._routes.values()}
        self._batch_max = batch_max_messages
        self._poll_timeout_s = poll_timeout_s
        self._recent = {route.table: _RecentIds(remember_ids) for route in self._routes.values()}
        self._recent_batches = _RecentIds(remember_ids)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counters = SinkCounters()
        self.last_error: str | None = None

    @property
    def topics(self) -> list[str]:
        return [self._metrics_topic, *self._routes]

    def start(self) -> None:
        self._seed_recent_ids()
        self._thread = threading.Thread(target=self.run, name="dsec-clickhouse-sink", daemon=True)
        self._thread.start()

    def _seed_recent_ids(self) -> None:
        """Ids stored in the last day, so that replays across a restart are recognised."""
        for route in self._routes.values():
            with self._client_lock:
                result = self._client.query(
                    f"SELECT {route.id_column} FROM {route.table} "
                    "WHERE event_time > now() - INTERVAL 1 DAY "
                    f"ORDER BY event_time DESC LIMIT {self._recent[route.table].capacity}"
                )
            for (event_id,) in reversed(result.result_rows):
                self._recent[route.table].add(event_id)

    def _stored_offsets(self) -> dict[tuple[str, int], int]:
        with self._client_lock:
            result = self._client.query(
                "SELECT topic, partition, argMax(next_offset, updated_at) FROM sink_offsets "
                "WHERE consumer_group = {group:String} GROUP BY topic, partition",
                parameters={"group": self._group},
            )
        return {(topic, int(partition)): int(offset)
                for topic, partition, offset in result.result_rows}

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        stored = self._stored_offsets()
        for tp in partitions:
            offset = stored.get((tp.topic, tp.partition))
            if offset is not None:
                tp.offset = offset
        consumer.assign(partitions)

    def run(self) -> None:
        """Consume, prepare, store, commit; a batch is prepared while the one before is
        being stored (the ClickHouse engine releases the interpreter lock while it writes)."""
        consumer = Consumer(self._consumer_config)
        consumer.subscribe(self.topics, on_assign=self._on_assign)
        pending: tuple[Future[None], PreparedBatch] | None = None

        def finish() -> None:
            future, batch = pending  # type: ignore[misc]
            future.result()
            if batch.next_offsets:
                consumer.commit(offsets=batch.commit_offsets(), asynchronous=False)

        try:
            with ThreadPoolExecutor(1, thread_name_prefix="dsec-sink-writer") as writer:
                while not self._stop.is_set():
                    messages = consumer.consume(self._batch_max, self._poll_timeout_s)
                    prepared = self.prepare(messages) if messages else None
                    if pending is not None:
                        finish()
                        pending = None
                    if prepared is not None:
                        pending = (writer.submit(self.store, prepared), prepared)
                if pending is not None:
                    finish()
        finally:
            consumer.close()

    def write(self, messages: list[Message]) -> None:
        """Stores a consumed batch and records where the next one starts."""
        self.store(self.prepare(messages))

    def prepare(self, messages: list[Message]) -> PreparedBatch:
        """Decodes and deduplicates a consumed batch into what each table receives."""
        raw = RawColumnsBuilder()
        batch = PreparedBatch()
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("sink: %s", error)
                continue
            topic, value = message.topic(), message.value()
            batch.next_offsets[(topic, message.partition())] = message.offset() + 1
            self.counters.messages += 1
            if topic == self._metrics_topic:
                self._add_raw(raw, value, batch)
                continue
            route = self._routes.get(topic)
            if route is None:
                continue
            try:
                event = decode(value, route.model)
            except DecodeError as exc:
                self.counters.undecodable += 1
                log.warning("sink: skipping %s@%d: %s", topic, message.offset(), exc.reason)
                continue
            event_id = route.id_of(event)
            if event_id in self._recent[route.table]:
                self.counters.duplicates_skipped += 1
                continue
            self._recent[route.table].add(event_id)
            batch.rows.setdefault(route.table, []).extend(route.to_rows(event))
            batch.token(route.table).update(event_id.encode())
        batch.arrow = raw.tables()
        return batch

    def store(self, batch: PreparedBatch) -> None:
        """Writes a prepared batch, then where the next one starts (``sink_offsets``)."""
        for table, arrow_table in batch.arrow.items():
            token = f"{table}:{batch.token('raw').hexdigest()}"
            self._insert(table, lambda t=table, a=arrow_table, k=token: self._client.insert_arrow(
                t, a, settings={"insert_deduplication_token": k}))
            self._count(table, arrow_table.num_rows)
        for table, table_rows in batch.rows.items():
            route = self._tables[table]
            token = batch.token(table).hexdigest()
            self._insert(table, lambda t=table, r=table_rows, c=route.columns, k=token:
                         self._client.insert(t, r, column_names=c,
                                             settings={"insert_deduplication_token": k}))
            self._count(table, len(table_rows))
        if batch.next_offsets:
            offset_rows = [[self._group, topic, partition, offset]
                           for (topic, partition), offset in batch.next_offsets.items()]
            self._insert("sink_offsets", lambda: self._client.insert(
                "sink_offsets", offset_rows,
                column_names=["consumer_group", "topic", "partition", "next_offset"]))

    def _add_raw(self, raw: RawColumnsBuilder, value: bytes, batch: PreparedBatch) -> None:
        try:
            decoded = decode_metric_batch(value)
        except DecodeError:
            # The metrics job dead-letters these, with the reason; here they are only counted.
            self.counters.undecodable += 1
            return
        batch_id = decoded.header.event_id
        if batch_id in self._recent_batches:
            self.counters.duplicates_skipped += 1
            return
        self._recent_batches.add(batch_id)
        raw.add(decoded.header, decoded.frames)
        self.counters.samples += decoded.sample_count()
        batch.token("raw").update(batch_id.encode())

    def _count(self, table: str, added: int) -> None:
        self.counters.rows_by_table[table] = self.counters.rows_by_table.get(table, 0) + added

    def _insert(self, table: str, insert: Callable[[], object]) -> None:
        for attempt in Retrying(wait=wait_exponential(min=0.2, max=10), stop=stop_never,
                                reraise=True):
            with attempt:
                if self._stop.is_set() and attempt.retry_state.attempt_number > 3:
                    raise RuntimeError(f"sink stopping; {table} batch not written")
                try:
                    with self._client_lock:
                        insert()
                except Exception as exc:
                    self.counters.insert_retries += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.warning("sink: insert into %s failed, retrying: %s", table, exc)
                    raise

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None


def wait_until_drained(
    consumer_config: dict, topics: list[str], timeout_s: float, poll_s: float = 0.5
) -> bool:
    """True once the group's committed offsets reach the end of every topic."""
    probe = Consumer({**consumer_config, "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + timeout_s
        metadata = probe.list_topics(timeout=10)
        partitions = [
            TopicPartition(topic, partition)
            for topic in topics
            for partition in metadata.topics[topic].partitions
        ]
        while time.monotonic() < deadline:
            committed = probe.committed(partitions, timeout=10)
            if all(
                max(tp.offset, 0) >= probe.get_watermark_offsets(tp, timeout=10)[1]
                for tp in committed
            ):
                return True
            time.sleep(poll_s)
        return False
    finally:
        probe.close()

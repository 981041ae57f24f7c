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

A block the server rejects for its contents (not for a lost connection) is split until
the events it cannot store are known; those go to the dead-letter topic with the server's
reason before the batch's offsets move, and the rest is stored. A message the sink cannot
prepare at all is dead-lettered the same way, and the batch goes on without it; should the
loop die anyway, a supervisor restarts it, and the health check fails until it runs again.
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

import numpy as np
from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from pydantic import BaseModel
from tenacity import Retrying, retry_if_not_exception_type, stop_never, wait_exponential

from dsec.infra.observability.kafka import ConsumerLag
from dsec.infra.observability.metrics import (
    EVENTS_DEAD_LETTERED,
    EVENTS_IN,
    EVENTS_OUT,
    STORE_REJECTED,
    ProcessMetrics,
)
from dsec.infra.store import rows
from dsec.infra.store.insert_errors import InsertFailure, classify_insert_error, short_reason
from dsec.infra.store.raw_columns import RawColumnsBuilder
from dsec.infra.supervisor import LoopSupervisor
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    DeadLetter,
    DecodeError,
    FeatureEvent,
    GpuProfileEvent,
    PolicyDecision,
    decode,
    encode,
)
from dsec.schemas.event_times import EventTimeWindow
from dsec.schemas.fast_decode import DecodedBatch, decode_metric_batch
from dsec.schemas.metrics import duplicate_key
from dsec.schemas.topics import TopicNames

log = logging.getLogger(__name__)
SERVICE = "sink"
UNPREPARABLE = "unpreparable"  # the reason class of a message the sink could not prepare


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


@dataclass(frozen=True)
class Source:
    """Where a stored event came from, to dead-letter it if the store refuses it."""

    topic: str
    partition: int
    offset: int
    value: bytes


@dataclass(frozen=True)
class StoredEvent:
    event_id: str
    source: Source
    rows: list[rows.Row]


class InsertRejected(Exception):
    """The server refused a block for what is in it; the same block will never go in."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class PreparedBatch:
    """A consumed batch, decoded: what each table receives, and where the next one starts.
    Each table's deduplication token hashes the ids of the events it holds."""

    arrow: dict[str, Any] = field(default_factory=dict)
    events: dict[str, list[StoredEvent]] = field(default_factory=dict)
    raw_sources: dict[str, Source] = field(default_factory=dict)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    tokens: dict[str, Any] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    unpreparable: int = 0  # of the dead letters, messages the sink could not prepare

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
    inserts_rejected: int = 0
    dead_lettered: int = 0
    dead_letters_unstorable: int = 0
    unpreparable: int = 0  # messages the sink failed on (dead-lettered, the batch went on)
    loop_restarts: int = 0


class ClickHouseSink:
    def __init__(
        self,
        client: Client,
        client_lock: threading.Lock,
        consumer_config: dict,
        topics: TopicNames,
        producer_config: dict,
        batch_max_messages: int = 2000,
        poll_timeout_s: float = 0.1,
        remember_ids: int = 200_000,
        metrics: ProcessMetrics | None = None,
        stalled_after_s: float = 120.0,
        event_times: EventTimeWindow | None = None,
        restart_delay_s: float = 0.5,
    ) -> None:
        """``stalled_after_s``: the sink reports itself unhealthy once its loop has not
        come round for that long (a store that keeps refusing writes, say).
        ``event_times``: the sample times the store keeps (the default: its defaults);
        the metrics job dead-letters samples outside it, the sink skips them."""
        self._client = client
        self._client_lock = client_lock
        self._consumer_config = consumer_config
        self._group = str(consumer_config["group.id"])
        self._metrics_topic = topics.metrics
        self._dead_letter_topic = topics.dead_letters
        self._producer = Producer(producer_config)
        self._producer_closed = False
        self._routes = routes_for(topics)
        self._tables = {route.table: route for route in self._routes.values()}
        self._batch_max = batch_max_messages
        self._poll_timeout_s = poll_timeout_s
        self._recent = {route.table: _RecentIds(remember_ids) for route in self._routes.values()}
        self._recent_batches = _RecentIds(remember_ids)
        self._event_times = event_times or EventTimeWindow()
        self._stop = threading.Event()
        self._supervisor: LoopSupervisor | None = None
        self._restart_delay_s = restart_delay_s
        self.counters = SinkCounters()
        self.last_error: str | None = None
        metrics = metrics or ProcessMetrics()
        self._events_in = metrics.counter(EVENTS_IN)
        self._rows_out = metrics.counter(EVENTS_OUT)
        self._dead_lettered = metrics.counter(EVENTS_DEAD_LETTERED).labels(
            SERVICE, STORE_REJECTED)
        self._unpreparable = metrics.counter(EVENTS_DEAD_LETTERED).labels(SERVICE, UNPREPARABLE)
        self._lag = ConsumerLag(metrics, SERVICE)
        self._stalled_after_s = stalled_after_s
        self._last_round_s: float | None = None
        metrics.add_health_check("clickhouse-sink", self.health)

    @property
    def topics(self) -> list[str]:
        return [self._metrics_topic, *self._routes]

    def health(self) -> str | None:
        """None while the consumer loop is alive and coming round, else what is wrong."""
        if self._supervisor is None:
            return "the sink's consumer loop is not running"
        self.counters.loop_restarts = self._supervisor.restarts
        down = self._supervisor.down()
        if down is not None:
            return down
        if self._last_round_s is None:
            return "the sink's consumer loop has not started yet"
        silent_s = time.monotonic() - self._last_round_s
        if silent_s > self._stalled_after_s:
            return (f"the sink's consumer loop has not come round for {silent_s:.0f} s"
                    + (f" (last error: {self.last_error})" if self.last_error else ""))
        return None

    def start(self) -> None:
        self._seed_recent_ids()
        self._supervisor = LoopSupervisor(self.run, "the sink's consumer loop", self._stop,
                                          first_delay_s=self._restart_delay_s)
        self._supervisor.start()

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
        self._last_round_s = None
        consumer = Consumer({**self._consumer_config, **self._lag.client_config()})
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
                    self._last_round_s = time.monotonic()
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
        batch = PreparedBatch()
        raw_batches: list[tuple[Source, DecodedBatch]] = []
        consumed: dict[str, int] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("sink: %s", error)
                continue
            topic, value = message.topic(), message.value()
            batch.next_offsets[(topic, message.partition())] = message.offset() + 1
            consumed[topic] = consumed.get(topic, 0) + 1
            self.counters.messages += 1
            source = Source(topic, message.partition(), message.offset(), value)
            try:
                if topic == self._metrics_topic:
                    self._add_raw(source, raw_batches)
                else:
                    self._add_event(source, batch)
            except Exception as exc:  # one message never stops the others' storage
                self._unpreparable_message(batch, source, exc)
        batch.arrow = self._raw_tables(raw_batches, batch)
        for topic, count in consumed.items():
            self._events_in.labels(SERVICE, topic).inc(count)
        return batch

    def store(self, batch: PreparedBatch) -> None:
        """Writes a prepared batch, its dead letters, then where the next one starts
        (``sink_offsets``)."""
        for table, arrow_table in batch.arrow.items():
            self._store_arrow(table, arrow_table, batch)
        for table, events in batch.events.items():
            self._store_events(table, events, batch)
        if batch.dead_letters:
            self._publish_dead_letters(batch.dead_letters, batch.unpreparable)
        if batch.next_offsets:
            offset_rows = [[self._group, topic, partition, offset]
                           for (topic, partition), offset in batch.next_offsets.items()]
            self._insert("sink_offsets", lambda: self._client.insert(
                "sink_offsets", offset_rows,
                column_names=["consumer_group", "topic", "partition", "next_offset"]))

    def _store_arrow(self, table: str, arrow_table: Any, batch: PreparedBatch) -> None:
        token = f"{table}:{batch.token('raw').hexdigest()}"
        try:
            self._insert(table, lambda: self._client.insert_arrow(
                table, arrow_table, settings={"insert_deduplication_token": token}))
            self._count(table, arrow_table.num_rows)
            return
        except InsertRejected:
            pass
        # Each message's rows of a kind are contiguous and number from 0.
        starts = np.flatnonzero(arrow_table.column("seq").to_numpy() == 0)
        bounds = [*starts.tolist(), arrow_table.num_rows]
        batch_ids = arrow_table.column("batch_id")

        def insert(lo: int, hi: int, sub_token: str) -> None:
            part = arrow_table.slice(bounds[lo], bounds[hi] - bounds[lo])
            self._client.insert_arrow(table, part,
                                      settings={"insert_deduplication_token": sub_token})
            self._count(table, part.num_rows)

        def reject(unit: int, reason: str) -> None:
            source = batch.raw_sources[batch_ids[bounds[unit]].as_py()]
            self._dead_letter(batch, source, reason)

        self._split_insert(table, len(starts), token, insert, reject)

    def _store_events(self, table: str, events: list[StoredEvent], batch: PreparedBatch) -> None:
        columns = self._tables[table].columns

        def insert(lo: int, hi: int, sub_token: str) -> None:
            table_rows = [row for event in events[lo:hi] for row in event.rows]
            self._client.insert(table, table_rows, column_names=columns,
                                settings={"insert_deduplication_token": sub_token})
            self._count(table, len(table_rows))

        def reject(unit: int, reason: str) -> None:
            if table == "dead_letters":
                self.counters.dead_letters_unstorable += 1
                log.error("sink: a dead letter cannot be stored (%s); it stays on %s",
                          reason, self._dead_letter_topic)
                return
            self._dead_letter(batch, events[unit].source, reason)

        token = batch.token(table).hexdigest()
        try:
            self._insert(table, lambda: insert(0, len(events), token))
        except InsertRejected:
            self._split_insert(table, len(events), token, insert, reject)

    def _split_insert(
        self,
        table: str,
        count: int,
        token: str,
        insert: Callable[[int, int, str], None],
        reject: Callable[[int, str], None],
    ) -> None:
        """Units [0, count) were refused as one block: halves are tried until the units
        refused on their own are known. Each part's token derives from the block's, so a
        replay of the same batch is still recognised."""
        parts = [(count // 2, count), (0, count // 2)]
        while parts:
            lo, hi = parts.pop()
            if hi <= lo:
                continue
            sub_token = f"{token}:{lo}-{hi}"
            try:
                self._insert(table, lambda lo=lo, hi=hi, k=sub_token: insert(lo, hi, k))
            except InsertRejected as exc:
                if hi - lo == 1:
                    reject(lo, exc.reason)
                else:
                    middle = (lo + hi) // 2
                    parts += [(middle, hi), (lo, middle)]

    def _dead_letter(self, batch: PreparedBatch, source: Source, reason: str) -> None:
        self.counters.dead_lettered += 1
        log.warning("sink: %s@%d:%d dead-lettered: %s", source.topic, source.partition,
                    source.offset, reason)
        batch.dead_letters.append(DeadLetter.for_message(
            topic=source.topic, partition=source.partition, offset=source.offset,
            reason=reason, payload=source.value))

    def _publish_dead_letters(self, letters: list[DeadLetter], unpreparable: int = 0) -> None:
        """Durable on the dead-letter topic before the batch's offsets are recorded."""
        failures: list[str] = []

        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                failures.append(str(error))

        for letter in letters:
            self._producer.produce(self._dead_letter_topic, key=letter.source_topic.encode(),
                                   value=encode(letter), on_delivery=delivered)
        remaining = self._producer.flush(60)
        if remaining or failures:
            raise RuntimeError(f"dead letters not delivered: {remaining} pending, {failures}")
        self._dead_lettered.inc(len(letters) - unpreparable)
        self._unpreparable.inc(unpreparable)
        self._rows_out.labels(SERVICE, self._dead_letter_topic).inc(len(letters))

    def _add_event(self, source: Source, batch: PreparedBatch) -> None:
        route = self._routes.get(source.topic)
        if route is None:
            return
        try:
            event = decode(source.value, route.model)
        except DecodeError as exc:
            self.counters.undecodable += 1
            log.warning("sink: skipping %s@%d: %s", source.topic, source.offset, exc.reason)
            return
        event_id = route.id_of(event)
        if event_id in self._recent[route.table]:
            self.counters.duplicates_skipped += 1
            return
        stored = StoredEvent(event_id, source, route.to_rows(event))
        self._recent[route.table].add(event_id)
        batch.events.setdefault(route.table, []).append(stored)
        batch.token(route.table).update(event_id.encode())

    def _add_raw(self, source: Source, raw_batches: list[tuple[Source, DecodedBatch]]) -> None:
        try:
            decoded = decode_metric_batch(source.value, self._event_times)
        except DecodeError:
            # The metrics job dead-letters these, with the reason; here they are only counted.
            self.counters.undecodable += 1
            return
        RawColumnsBuilder().add(decoded.header, decoded.frames)  # raises where it cannot go in
        batch_id = duplicate_key(decoded.header)
        if batch_id in self._recent_batches:
            self.counters.duplicates_skipped += 1
            return
        self._recent_batches.add(batch_id)
        raw_batches.append((source, decoded))

    def _raw_tables(self, raw_batches: list[tuple[Source, DecodedBatch]],
                    batch: PreparedBatch) -> dict[str, Any]:
        """One Arrow table per raw table. Should the batches not go together, each is tried
        alone and those that fail are dead-lettered."""
        raw = RawColumnsBuilder()
        for _, decoded in raw_batches:
            raw.add(decoded.header, decoded.frames)
        try:
            tables = raw.tables()
        except Exception:
            raw, kept = RawColumnsBuilder(), []
            for source, decoded in raw_batches:
                alone = RawColumnsBuilder()
                alone.add(decoded.header, decoded.frames)
                try:
                    alone.tables()
                except Exception as exc:
                    self._unpreparable_message(batch, source, exc)
                    continue
                raw.add(decoded.header, decoded.frames)
                kept.append((source, decoded))
            raw_batches, tables = kept, raw.tables()
        for source, decoded in raw_batches:
            batch_id = duplicate_key(decoded.header)
            batch.raw_sources[batch_id] = source
            self.counters.samples += decoded.sample_count()
            batch.token("raw").update(batch_id.encode())
        return tables

    def _unpreparable_message(self, batch: PreparedBatch, source: Source,
                              exc: Exception) -> None:
        self.counters.unpreparable += 1
        batch.unpreparable += 1
        self._dead_letter(batch, source, f"the sink could not prepare it: "
                                         f"{type(exc).__name__}: {exc}"[:1000])

    def _count(self, table: str, added: int) -> None:
        self.counters.rows_by_table[table] = self.counters.rows_by_table.get(table, 0) + added
        self._rows_out.labels(SERVICE, table).inc(added)

    def _insert(self, table: str, insert: Callable[[], object]) -> None:
        """Retries what may go away (connection, load, schema not there yet) for ever;
        raises ``InsertRejected`` at once when the server refuses the rows themselves."""
        for attempt in Retrying(wait=wait_exponential(min=0.2, max=10), stop=stop_never,
                                retry=retry_if_not_exception_type(InsertRejected),
                                reraise=True):
            with attempt:
                if self._stop.is_set() and attempt.retry_state.attempt_number > 3:
                    raise RuntimeError(f"sink stopping; {table} batch not written")
                try:
                    with self._client_lock:
                        insert()
                except Exception as exc:
                    if classify_insert_error(exc) is InsertFailure.REJECTED:
                        self.counters.inserts_rejected += 1
                        raise InsertRejected(short_reason(table, exc)) from exc
                    self.counters.insert_retries += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.warning("sink: insert into %s failed, retrying: %s", table, exc)
                    raise

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stops the loop, delivers what the dead-letter producer holds and lets go of it
        (a producer left to the garbage collector keeps reconnecting to a broker that is
        gone, from threads of its own)."""
        self._stop.set()
        supervisor, self._supervisor = self._supervisor, None
        ended = supervisor is None or supervisor.join(timeout_s)
        if self._producer_closed:
            return
        self._producer.flush(timeout_s)
        if ended:  # a loop still running may publish
            self._producer_closed = True
            self._producer.close()


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

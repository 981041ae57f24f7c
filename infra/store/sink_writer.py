"""The sink's ``BatchWriter``: ``write`` returns once a prepared batch is in ClickHouse,
its dead letters on their topic, and where the next batch starts in ``sink_offsets``.

Raw samples go column-wise (Arrow), one insert per raw table with a row per message; the
smaller topics one insert per table. Every insert carries the hash of its events' ids as the
deduplication token. A block the server rejects for its contents is split until the events
it cannot store are known; those are dead-lettered with the server's reason, the rest is
stored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from clickhouse_connect.driver.client import Client
from confluent_kafka import Message

from dsec.infra.consumer_loop import BatchWriter
from dsec.infra.dead_letter_producer import DeadLetterPublisher
from dsec.infra.observability.metrics import (
    EVENTS_DEAD_LETTERED,
    EVENTS_OUT,
    STORE_REJECTED,
    ProcessMetrics,
)
from dsec.infra.store.inserts import Inserter, InsertRejected
from dsec.infra.store.raw_columns import sample_view_name
from dsec.infra.store.recent_ids import RecentIds
from dsec.infra.store.sink_batch import (
    RAW_SCOPE,
    SERVICE,
    UNPREPARABLE,
    PreparedBatch,
    SinkCounters,
    Source,
    StoredEvent,
    TableRoute,
)
from dsec.infra.store.sink_prepare import BatchPreparer
from dsec.schemas import DeadLetter

log = logging.getLogger(__name__)
OFFSET_COLUMNS = ["consumer_group", "topic", "partition", "next_offset"]


class SinkWriter(BatchWriter[PreparedBatch]):
    def __init__(self, client: Client, group: str, routes: dict[str, TableRoute],
                 preparer: BatchPreparer, inserter: Inserter, dead_letters: DeadLetterPublisher,
                 recent: RecentIds, counters: SinkCounters, metrics: ProcessMetrics) -> None:
        self._client = client
        self._group = group
        self._columns = {route.table: route.columns for route in routes.values()}
        self._preparer = preparer
        self._inserter = inserter
        self._dead_letters = dead_letters
        self._recent = recent
        self._counters = counters
        self._rows_out = metrics.counter(EVENTS_OUT)
        self._rejected = metrics.counter(EVENTS_DEAD_LETTERED).labels(SERVICE, STORE_REJECTED)
        self._unpreparable = metrics.counter(EVENTS_DEAD_LETTERED).labels(SERVICE, UNPREPARABLE)

    def prepare(self, messages: Sequence[Message]) -> PreparedBatch:
        return self._preparer.prepare(messages)

    def write(self, batch: PreparedBatch) -> None:
        """Stores a prepared batch, its dead letters, then where the next one starts. Its
        ids are kept as stored once all of that is durable, and given back otherwise."""
        try:
            for table, arrow_table in batch.arrow.items():
                self._store_arrow(table, arrow_table, batch)
            for table, events in batch.events.items():
                self._store_events(table, events, batch)
            if batch.dead_letters:
                self._dead_letters.publish(batch.dead_letters)
                self._rejected.inc(len(batch.dead_letters) - batch.unpreparable)
                self._unpreparable.inc(batch.unpreparable)
            self._record_offsets(batch.next_offsets)
        except BaseException:
            self._recent.release(batch.claims)
            raise
        self._recent.keep(batch.claims)

    def dead_letter(self, message: Message, reason: str) -> None:
        """The consumer loop's dead-letter callback, for a message the sink failed on alone
        (the loop counts it under ``UNPREPARABLE``): durable, and its offset recorded."""
        letter = DeadLetter.for_message(
            topic=message.topic(), partition=message.partition(), offset=message.offset(),
            reason=reason, payload=message.value())
        self._dead_letters.publish([letter])
        self._counters.unpreparable += 1
        self._counters.dead_lettered += 1
        self._record_offsets({(message.topic(), message.partition()): message.offset() + 1})

    def _record_offsets(self, next_offsets: dict[tuple[str, int], int]) -> None:
        """``sink_offsets``: where a restarted sink resumes, so that a crash between this
        write and the Kafka commit does not replay the batch."""
        if not next_offsets:
            return
        offset_rows = [[self._group, topic, partition, offset]
                       for (topic, partition), offset in next_offsets.items()]
        self._inserter.insert("sink_offsets", lambda: self._client.insert(
            "sink_offsets", offset_rows, column_names=OFFSET_COLUMNS))

    def _store_arrow(self, table: str, arrow_table: Any, batch: PreparedBatch) -> None:
        token = f"{table}:{batch.token(RAW_SCOPE).hexdigest()}"
        try:
            self._inserter.insert(table, lambda: self._client.insert_arrow(
                table, arrow_table, settings={"insert_deduplication_token": token}))
            self._count_samples(table, arrow_table)
            return
        except InsertRejected:
            pass
        messages = batch.raw_messages[table]  # a row per message

        def insert(lo: int, hi: int, sub_token: str) -> None:
            part = arrow_table.slice(lo, hi - lo)
            self._client.insert_arrow(table, part,
                                      settings={"insert_deduplication_token": sub_token})
            self._count_samples(table, part)

        def reject(unit: int, reason: str) -> None:
            self._reject(batch, batch.raw_sources[messages[unit]], reason)

        self._inserter.split_insert(table, len(messages), token, insert, reject)

    def _store_events(self, table: str, events: list[StoredEvent], batch: PreparedBatch) -> None:
        columns = self._columns[table]

        def insert(lo: int, hi: int, sub_token: str) -> None:
            table_rows = [row for event in events[lo:hi] for row in event.rows]
            self._client.insert(table, table_rows, column_names=columns,
                                settings={"insert_deduplication_token": sub_token})
            self._count(table, len(table_rows))

        def reject(unit: int, reason: str) -> None:
            if table == "dead_letters":
                self._counters.dead_letters_unstorable += 1
                log.error("sink: a dead letter cannot be stored (%s); it stays on %s",
                          reason, self._dead_letters.topic)
                return
            self._reject(batch, events[unit].source, reason)

        token = batch.token(table).hexdigest()
        try:
            self._inserter.insert(table, lambda: insert(0, len(events), token))
        except InsertRejected:
            self._inserter.split_insert(table, len(events), token, insert, reject)

    def _reject(self, batch: PreparedBatch, source: Source, reason: str) -> None:
        """Dead-letters ``source`` once a batch, however many of its events (the rows of a
        message of columns) the store refused."""
        where = (source.topic, source.partition, source.offset)
        if where in batch.rejected:
            return
        batch.rejected.add(where)
        self._counters.dead_lettered += 1
        batch.add_dead_letter(source, reason)

    def _count_samples(self, table: str, arrow_table: Any) -> None:
        """A message table's rows are counted as their samples, under the per-sample view's
        name (the table's name as it read before messages were rows)."""
        offsets = arrow_table.column("times_ms").combine_chunks().offsets
        self._count(sample_view_name(table), int(offsets[-1].as_py() - offsets[0].as_py())
                    if len(offsets) else 0)

    def _count(self, table: str, added: int) -> None:
        self._counters.rows_by_table[table] = self._counters.rows_by_table.get(table, 0) + added
        self._rows_out.labels(SERVICE, table).inc(added)

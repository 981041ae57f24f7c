"""The ClickHouse sink: persists dsec's topics, committing offsets only after the write.

It is its own consumer group, and the only writer of the store: a chDB directory
can be open in one process only, so every other component publishes to Kafka.
A batch's insert carries a deduplication token made of its content's hash, so a
batch replayed after a crash between write and commit is not written twice.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, KafkaError, Message
from pydantic import BaseModel
from tenacity import Retrying, stop_never, wait_exponential

from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    DeadLetter,
    DecodeError,
    FeatureEvent,
    MetricBatch,
    PolicyDecision,
    decode,
)
from dsec.schemas.topics import TopicNames
from dsec.stream_jobs import rows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableRoute:
    table: str
    columns: list[str]
    model: type[BaseModel]
    to_rows: Callable[[Any], list[rows.Row]]


def routes_for(topics: TopicNames) -> dict[str, TableRoute]:
    return {
        topics.metrics: TableRoute(
            "raw_metrics", rows.RAW_METRICS_COLUMNS, MetricBatch, rows.metric_rows),
        topics.features: TableRoute(
            "features", rows.FEATURE_COLUMNS, FeatureEvent, rows.feature_rows),
        topics.actuations: TableRoute(
            "actuations", rows.ACTUATION_COLUMNS, ActuationCommand, rows.actuation_rows),
        topics.actuation_results: TableRoute(
            "actuation_results", rows.RESULT_COLUMNS, ActuationResult, rows.result_rows),
        topics.decisions: TableRoute(
            "policy_decisions", rows.DECISION_COLUMNS, PolicyDecision, rows.decision_rows),
        topics.dead_letters: TableRoute(
            "dead_letters", rows.DEAD_LETTER_COLUMNS, DeadLetter, rows.dead_letter_rows),
    }


@dataclass
class SinkCounters:
    messages: int = 0
    rows_by_table: dict[str, int] = field(default_factory=dict)
    undecodable: int = 0
    insert_retries: int = 0


class ClickHouseSink:
    def __init__(
        self,
        client: Client,
        client_lock: threading.Lock,
        consumer_config: dict,
        topics: TopicNames,
        batch_max_messages: int = 5000,
        poll_timeout_s: float = 0.2,
    ) -> None:
        self._client = client
        self._client_lock = client_lock
        self._consumer_config = consumer_config
        self._routes = routes_for(topics)
        self._batch_max = batch_max_messages
        self._poll_timeout_s = poll_timeout_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counters = SinkCounters()
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="dsec-clickhouse-sink", daemon=True)
        self._thread.start()

    def run(self) -> None:
        consumer = Consumer(self._consumer_config)
        consumer.subscribe(list(self._routes))
        try:
            while not self._stop.is_set():
                messages = consumer.consume(self._batch_max, self._poll_timeout_s)
                if messages:
                    self._write(messages)
                    consumer.commit(asynchronous=False)
        finally:
            consumer.close()

    def _write(self, messages: list[Message]) -> None:
        by_table: dict[str, list[rows.Row]] = {}
        digests: dict[str, hashlib.blake2b] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("sink: %s", error)
                continue
            route = self._routes.get(message.topic())
            if route is None:
                continue
            self.counters.messages += 1
            try:
                event = decode(message.value(), route.model)
            except DecodeError as exc:
                # Metrics are dead-lettered by the metrics job; here they are only counted.
                self.counters.undecodable += 1
                log.debug("sink: skipping %s@%d: %s", message.topic(), message.offset(), exc)
                continue
            by_table.setdefault(route.table, []).extend(route.to_rows(event))
            digests.setdefault(route.table, hashlib.blake2b(digest_size=16)).update(
                message.value()
            )
        for table, table_rows in by_table.items():
            # The token is the content's hash: a batch replayed after a crash between insert
            # and commit carries the same events, hence the same token, and is not stored twice.
            self._insert(table, table_rows, digests[table].hexdigest())

    def _insert(self, table: str, table_rows: list[rows.Row], token: str) -> None:
        route = next(r for r in self._routes.values() if r.table == table)
        for attempt in Retrying(wait=wait_exponential(min=0.2, max=10), stop=stop_never,
                                reraise=True):
            with attempt:
                if self._stop.is_set() and attempt.retry_state.attempt_number > 3:
                    raise RuntimeError(f"sink stopping; {table} batch not written")
                try:
                    with self._client_lock:
                        self._client.insert(
                            table, table_rows, column_names=route.columns,
                            settings={"insert_deduplication_token": token},
                        )
                except Exception as exc:
                    self.counters.insert_retries += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.warning("sink: insert into %s failed, retrying: %s", table, exc)
                    raise
        self.counters.rows_by_table[table] = (
            self.counters.rows_by_table.get(table, 0) + len(table_rows)
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None


def wait_until_drained(
    consumer_config: dict, topics: list[str], timeout_s: float, poll_s: float = 0.5
) -> bool:
    """True once the sink group's committed offsets reach the end of every topic."""
    from confluent_kafka import TopicPartition

    probe = Consumer({**consumer_config, "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + timeout_s
        partitions = []
        metadata = probe.list_topics(timeout=10)
        for topic in topics:
            for partition in metadata.topics[topic].partitions:
                partitions.append(TopicPartition(topic, partition))
        while time.monotonic() < deadline:
            committed = probe.committed(partitions, timeout=10)
            behind = False
            for tp in committed:
                _low, high = probe.get_watermark_offsets(tp, timeout=10)
                position = tp.offset if tp.offset >= 0 else 0
                if position < high:
                    behind = True
                    break
            if not behind:
                return True
            time.sleep(poll_s)
        return False
    finally:
        probe.close()

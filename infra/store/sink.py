"""The ClickHouse sink: persists dsec's topics, committing offsets only after the write.

It is its own consumer group, and the only writer of the embedded store: a chDB
directory can be open in one process only, so every other component publishes to
Kafka. It is a ``ConsumerLoop`` (``infra/consumer_loop.py``) handing batches to a
``SinkWriter`` (``sink_writer.py``), a batch prepared while the one before is written (the
ClickHouse engine releases the interpreter lock while it writes). Nothing is stored twice:
- raw samples go column-wise (Arrow) into one table per sample kind;
- after each write, the next offsets are recorded in ClickHouse (``sink_offsets``)
  before they are committed to Kafka, and a restarted sink resumes from the record,
  so a crash between the write and the commit does not replay the batch;
- metric batches are deduplicated by batch id, the smaller topics by event id (derived
  outputs of the stream jobs carry deterministic ids, so a replayed stream batch
  re-derives the same ids);
- every insert carries the hash of its events' ids as the deduplication token.

Rows the server refuses for their contents, and messages the sink cannot prepare, go to
the dead-letter topic with the reason before the batch's offsets move, and the rest is
stored. Should the loop die anyway (the store or the broker gone), a supervisor restarts
it, and the health check fails until it runs again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, TopicPartition

from dsec.infra.consumer_loop import ConsumerLoop, ConsumerLoopConfig, PartitionKey
from dsec.infra.dead_letter_producer import DeadLetterProducer, DeadLetterPublisher
from dsec.infra.observability.metrics import ProcessMetrics
from dsec.infra.store.inserts import Inserter
from dsec.infra.store.recent_ids import RecentIds
from dsec.infra.store.sink_batch import SERVICE, UNPREPARABLE, SinkCounters, routes_for
from dsec.infra.store.sink_prepare import BatchPreparer
from dsec.infra.store.sink_writer import SinkWriter
from dsec.infra.supervisor import LoopSupervisor
from dsec.schemas.event_times import EventTimeWindow
from dsec.schemas.topics import TopicNames

__all__ = ["ClickHouseSink", "SinkCounters", "wait_until_drained"]


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
        *,
        dead_letters: DeadLetterPublisher | None = None,
        consumer_factory: Callable[[dict], Any] = Consumer,
    ) -> None:
        """``consumer_config``: with the group, from ``kafka_clients.consumer_config``
        (``BULK_FETCH`` for a backlog of probe batches). ``client_lock``: held around every
        use of ``client``, which the query server shares. ``stalled_after_s``: the sink
        reports itself unhealthy once its loop has not come round for that long (a store
        that keeps refusing writes, say). ``event_times``: the sample times the store keeps
        (the default: its defaults); the metrics job dead-letters samples outside it, the
        sink skips them. ``dead_letters`` (default: a producer on ``producer_config``) and
        ``consumer_factory``: the Kafka clients, but in tests."""
        self._client = client
        self._client_lock = client_lock
        self._group = str(consumer_config["group.id"])
        self._routes = routes_for(topics)
        self._stop = threading.Event()
        self._recent = RecentIds(remember_ids)
        self._supervisor: LoopSupervisor | None = None
        self._restart_delay_s = restart_delay_s
        self.counters = SinkCounters()
        metrics = metrics or ProcessMetrics()
        self._dead_letters = dead_letters or DeadLetterProducer(
            producer_config, topics.dead_letters, SERVICE, metrics)
        self._inserter = Inserter(client_lock, self.counters, self._stop)
        preparer = BatchPreparer(topics, self._recent, self.counters, metrics,
                                 event_times or EventTimeWindow())
        self.writer = SinkWriter(client, self._group, self._routes, preparer, self._inserter,
                                 self._dead_letters, self._recent, self.counters, metrics)
        self.topics = [topics.metrics, *self._routes]
        self._loop = ConsumerLoop(
            ConsumerLoopConfig(tuple(self.topics), self._group, poll_timeout_s=poll_timeout_s,
                               batch_max_messages=batch_max_messages, overlap_writes=True,
                               stalled_after_s=stalled_after_s,
                               dead_letter_reason=UNPREPARABLE),
            consumer_config, self.writer, self.writer.dead_letter, service=SERVICE,
            metrics=metrics, stop=self._stop, starting_offsets=self._stored_offsets,
            consumer_factory=consumer_factory)
        metrics.add_health_check("clickhouse-sink", self.health)

    @property
    def last_error(self) -> str | None:
        """The last insert failure that was retried."""
        return self._inserter.last_error

    def health(self) -> str | None:
        """None while the consumer loop is alive and coming round, else what is wrong."""
        if self._supervisor is None:
            return "the sink's consumer loop is not running"
        self.counters.loop_restarts = self._supervisor.restarts
        down = self._supervisor.down()
        if down is not None:
            return down
        down = self._loop.down()
        if down is not None and self.last_error:
            return f"{down} (last error: {self.last_error})"
        return down

    def start(self) -> None:
        self._seed_recent_ids()
        self._supervisor = LoopSupervisor(self._run_loop, "the sink's consumer loop",
                                          self._stop, first_delay_s=self._restart_delay_s)
        self._supervisor.start()

    def _run_loop(self) -> None:
        # The batches of a loop that died are read again by this one: their ids go back.
        self._recent.release_all()
        self._loop.run()

    def _seed_recent_ids(self) -> None:
        """Ids stored in the last day, so that replays across a restart are recognised."""
        for route in self._routes.values():
            with self._client_lock:
                result = self._client.query(
                    f"SELECT {route.id_column} FROM {route.table} "
                    "WHERE event_time > now() - INTERVAL 1 DAY "
                    f"ORDER BY event_time DESC LIMIT {self._recent.capacity}"
                )
            self._recent.seed(route.table, (event_id for (event_id,)
                                             in reversed(result.result_rows)))

    def _stored_offsets(self, _partitions: list[TopicPartition]) -> dict[PartitionKey, int]:
        """Where the partitions the loop is given start: after what ``sink_offsets`` says
        was stored, which may be ahead of the group's commit."""
        with self._client_lock:
            result = self._client.query(
                "SELECT topic, partition, argMax(next_offset, updated_at) FROM sink_offsets "
                "WHERE consumer_group = {group:String} GROUP BY topic, partition",
                parameters={"group": self._group},
            )
        return {(topic, int(partition)): int(offset)
                for topic, partition, offset in result.result_rows}

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stops the loop, delivers what the dead-letter producer holds and lets go of it,
        unless the loop is still running and may publish."""
        self._stop.set()
        supervisor, self._supervisor = self._supervisor, None
        ended = supervisor is None or supervisor.join(timeout_s)
        self._dead_letters.close(timeout_s, release=ended)


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

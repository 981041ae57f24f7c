"""Rows the ClickHouse server refuses do not stall the sink: the block is split, what cannot
be stored alone goes to the dead-letter topic with the server's reason, the rest is stored."""

from __future__ import annotations

import threading
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from helpers import wait_for

from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.observability import ProcessMetrics
from dsec.infra.store.clickhouse import connect, ensure_schema
from dsec.infra.store.sink import ClickHouseSink
from dsec.infra.topics import ensure_topics
from dsec.schemas import (
    DeadLetter,
    FeatureEvent,
    MetricBatch,
    StepSample,
    WorkerIdentity,
    decode,
    encode,
    now_ms,
    topic_names,
)
from dsec.schemas.event_times import EventTimeWindow

DAY_MS = 86_400_000


def _identity(worker_id: str) -> WorkerIdentity:
    return WorkerIdentity(job_id="test-job", node_id="node-a", worker_id=worker_id)


@pytest.fixture
def client(tmp_path):
    client = connect(f"chdb://{tmp_path / 'store'}")
    yield client
    client.close()  # chDB holds one store per process: let the next test open its own


def test_refused_rows_are_dead_lettered_and_the_rest_is_stored(settings, client) -> None:
    topics = topic_names(settings.topic_prefix)
    ensure_topics(settings, partitions=1)
    ensure_schema(client, ttl_days=365)  # the replayed history below is 150 days old

    producer = Producer(producer_config(settings, "test"))
    start_ms = now_ms() - 160 * DAY_MS
    # A runtime with a broken clock: one batch whose steps span 150 days is a message the
    # server refuses (its samples span more than a day), whatever it is batched with.
    poisoned = MetricBatch(identity=_identity("broken-clock"), samples=[
        StepSample(event_time_ms=start_ms + day * DAY_MS, step=day) for day in range(150)
    ])
    healthy = [MetricBatch(identity=_identity(f"healthy-{n}"), samples=[
        StepSample(event_time_ms=now_ms() + step, step=step) for step in range(20)
    ]) for n in range(6)]
    for batch in [*healthy[:3], poisoned, *healthy[3:]]:
        producer.produce(topics.metrics, key=batch.identity.worker_id.encode(),
                         value=encode(batch))
    # Replayed history: features over 150 days, refused as one block, fine in halves.
    history = [FeatureEvent(identity=_identity("replayed"), event_time_ms=start_ms + day * DAY_MS,
                            features={"reward_mean": float(day)}) for day in range(150)]
    for event in history:
        producer.produce(topics.features, key=b"replayed", value=encode(event))
    assert producer.flush(30) == 0

    metrics = ProcessMetrics()
    sink = ClickHouseSink(client, threading.Lock(),
                          consumer_config(settings, f"sink-{uuid.uuid4().hex[:6]}"), topics,
                          producer_config(settings, "test-sink"), metrics=metrics,
                          event_times=EventTimeWindow(ttl_days=365))
    sink.start()
    try:
        wait_for(lambda: sink.counters.rows_by_table.get("features", 0) == 150
                 and sink.counters.dead_lettered == 1, 90, what="the batch stored around the "
                 "refused rows")
        # The dead letter comes back through the sink into its table.
        wait_for(lambda: sink.counters.rows_by_table.get("dead_letters", 0) == 1, 60,
                 what="the dead letter stored")
    finally:
        sink.stop()

    def scalar(sql: str) -> int:
        return int(client.query(sql).result_rows[0][0])

    assert scalar("SELECT count() FROM raw_step WHERE worker_id LIKE 'healthy-%'") == 120
    assert scalar("SELECT count() FROM raw_step WHERE worker_id = 'broken-clock'") == 0
    stored = client.query("SELECT count(), uniqExact(event_id) FROM features").result_rows
    assert stored == [(150, 150)]
    assert sink.counters.inserts_rejected >= 2 and sink.counters.insert_retries == 0
    assert metrics.registry.get_sample_value(
        "dsec_events_dead_lettered_total", {"service": "sink", "reason": "store_rejected"}) == 1
    reason, source_topic = client.query(
        "SELECT reason, source_topic FROM dead_letters").result_rows[0]
    assert source_topic == topics.metrics
    assert "raw_step" in reason and "samples_within_a_day" in reason

    consumer = Consumer(consumer_config(settings, uuid.uuid4().hex))
    consumer.assign([TopicPartition(topics.dead_letters, 0, 0)])
    try:
        message = wait_for(lambda: consumer.poll(0.5), 30, interval_s=0, what="the dead letter")
    finally:
        consumer.close()
    letter = decode(message.value(), DeadLetter)
    assert decode(letter.payload.encode(), MetricBatch).event_id == poisoned.event_id

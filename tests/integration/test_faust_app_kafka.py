"""The stream jobs' Faust app: stream buffers survive a resume of flow that is already on,
and are emptied when flow comes back from a suspension (what they hold then belongs to the
assignment before); table changelogs get the configured replication factor; a partition whose
commits stand still with messages behind them is logged and fails the health check; after a
rebalance, what was fetched and dropped is fetched again, committed offset or not."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from dsec.infra.faust_app import (
    seek_to_committed_or_reset,
)

TP = ("metrics", 0)






@pytest.mark.integration
def test_the_seek_after_a_rebalance_rewinds_partitions_with_no_committed_offset(
        kafka_bootstrap) -> None:
    """Messages the client handed over and Faust dropped during a table recovery are read
    again, also where the group never committed (aiokafka's own seek leaves those be)."""
    topic = f"seek-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result()
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for index in range(5):
        producer.produce(topic, value=b"%d" % index, partition=0)
    assert producer.flush(30) == 0

    async def positions() -> tuple[int, int, int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=topic,
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            fetched = 0
            while fetched < 5:  # handed over: the position is past them
                fetched += len((await consumer.getmany(tp, timeout_ms=1000)).get(tp, []))
            dropped_at = await consumer.position(tp)
            await seek_to_committed_or_reset(consumer, "earliest")
            never_committed = await consumer.position(tp)
            await consumer.commit({tp: 3})
            await consumer.getmany(tp, timeout_ms=1000)
            await seek_to_committed_or_reset(consumer, "earliest")
            return dropped_at, never_committed, await consumer.position(tp)
        finally:
            await consumer.stop()

    assert asyncio.run(positions()) == (5, 0, 3)

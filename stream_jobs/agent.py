"""The metrics job as a Faust agent: batches of the metrics topic through ``MetricsJob``,
its outputs published, then its worker states saved, then the batch acknowledged.

Per-worker state is a Faust table keyed like the metrics topic (by worker), so a restarted
or rebalanced stream worker resumes from it. A batch's input offsets are acknowledged
after every output of the batch is delivered: a failed delivery runs the batch again, and a
batch the job fails on otherwise is dead-lettered (``dsec.infra.batch_guard``).
"""

from __future__ import annotations

import asyncio
import time

from dsec.infra.batch_guard import delivered
from dsec.infra.consumer_loop_types import HANDLER_FAILED
from dsec.infra.faust_app import (
    TP,
    App,
    StreamT,
    batch_guard,
    fetch_topic_metadata,
    publish,
    record_of,
    topic_partitioner,
)
from dsec.infra.observability.metrics import ProcessMetrics
from dsec.infra.records import Output, Record
from dsec.schemas import now_ms
from dsec.schemas.event_times import EventTimeWindow
from dsec.schemas.topics import TopicNames
from dsec.stream_jobs.instruments import JobInstruments
from dsec.stream_jobs.metrics_job import JobCounters, MetricsJob
from dsec.stream_jobs.worker_features import FeatureConfig
from dsec.stream_jobs.worker_state import WorkerStateTable

__all__ = ["METRICS_JOB_TABLES", "register_metrics_job"]

METRICS_JOB_TABLES = ("worker-state",)


def register_metrics_job(
    app: App,
    topics: TopicNames,
    config: FeatureConfig | None = None,
    batch_max_messages: int = 500,
    batch_within_s: float = 0.05,
    metrics: ProcessMetrics | None = None,
    loop_turn_every_s: float = 0.001,
    event_times: EventTimeWindow | None = None,
) -> JobCounters:
    """``event_times``: the sample times the store keeps; batches with samples outside it
    are dead-lettered (the default: the store's default window)."""
    instruments = JobInstruments(metrics or ProcessMetrics(), topics)
    source = app.topic(topics.metrics, value_type=bytes, key_type=bytes)
    # Raw keys (the worker id's bytes, as on the metrics topic): the changelog partition
    # chosen by the partitioner is then the partition the worker's events are on.
    table = app.Table("worker-state", partitions=None, key_type=bytes, value_type=bytes,
                      use_partitioner=True)
    job = MetricsJob(topics, WorkerStateTable(table), config, event_times)

    async def send(output: Output) -> asyncio.Future:
        """Hands an output to the producer; the future resolves once the broker has it."""
        return await publish(app, output.topic, output.key, output.value())

    async def process(records: list[Record]) -> None:
        started_s = turn_s = time.perf_counter()
        batch = job.start_batch(now_ms())
        sends = []
        for record in records:
            if time.perf_counter() - turn_s > loop_turn_every_s:
                # A turn of the event loop now and then: the consumer's fetcher and the
                # producer's sender run in it, and a batch worked through in one go would
                # leave the next batch unfetched and this one's outputs unsent until the end.
                await asyncio.sleep(0)
                turn_s = time.perf_counter()
            letter = batch.add(record)
            if letter is not None:
                sends.append(await send(letter))
        result = batch.finish()
        for output in result.after_records:
            sends.append(await send(output))
        # Outputs first, state second: a crash in between replays the batch, which derives
        # the same outputs under the same ids (deduplicated downstream).
        await delivered(sends)
        job.save_batch(result)
        instruments.batch_done(started_s, len(records), result)

    guard = batch_guard(app, "metrics-job", topics.dead_letters,
                        lambda count: instruments.dead_lettered_batch(HANDLER_FAILED, count))

    @app.agent(source, name="metrics-job")
    async def metrics_job(stream: StreamT) -> None:
        await fetch_topic_metadata(app, table.changelog_topic.get_topic_name())
        async for events in stream.take_events(batch_max_messages, within=batch_within_s):
            # the features topic's partitions as the producer knows them now: a topic
            # given more partitions moves each worker's messages, and the rows with them
            job.feature_partition = await topic_partitioner(app, topics.features)
            await guard.run([record_of(event) for event in events], process)

    def partition_end(partition: int) -> int | None:
        try:
            return app.consumer.highwater(TP(topics.metrics, partition))
        except Exception:  # not assigned here (any more)
            return None

    @app.timer(interval=1.0)
    async def liveness_check() -> None:
        result = job.check_liveness(now_ms(), partition_end)
        job.save(result.overdue)
        await guard.deliver(result.outputs)
        job.save_lost(result)
        instruments.liveness_checked(result)

    return job.counters

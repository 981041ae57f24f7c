"""The card job as a Faust agent: batches of the gpu-cards topic through ``CardJob``, its
feature events published, then its card states saved, then the batch acknowledged (a
batch the job fails on is dead-lettered: ``dsec.infra.batch_guard``).

Card state is a Faust table keyed like the gpu-cards topic (by the card's UUID), so the
stream-job process that holds a card's partition holds all of the card's reports.
"""

from __future__ import annotations

from dsec.infra.faust_app import App, StreamT, batch_guard, fetch_topic_metadata, record_of
from dsec.infra.records import Record
from dsec.schemas.topics import TopicNames
from dsec.stream_jobs.card_job import CardCounters, CardJob, card_state_table

__all__ = ["CARD_JOB_TABLES", "register_card_job"]

CARD_JOB_TABLES = ("card-state",)


def register_card_job(app: App, topics: TopicNames, batch_max_messages: int = 500,
                      batch_within_s: float = 0.05) -> CardCounters:
    source = app.topic(topics.gpu_cards, value_type=bytes, key_type=bytes)
    # Raw keys (the card UUID's bytes, as on the gpu-cards topic), as the metrics job's table.
    table = app.Table(CARD_JOB_TABLES[0], partitions=None, key_type=bytes, value_type=bytes,
                      use_partitioner=True)
    job = CardJob(topics, card_state_table(table))
    guard = batch_guard(app, "card-job", topics.dead_letters)

    async def handle(records: list[Record]) -> None:
        outputs, states = job.process(records)
        await guard.deliver(outputs)
        job.save(states)

    @app.agent(source, name="card-job")
    async def card_job(stream: StreamT) -> None:
        await fetch_topic_metadata(app, table.changelog_topic.get_topic_name())
        async for events in stream.take_events(batch_max_messages, within=batch_within_s):
            await guard.run([record_of(event) for event in events], handle)

    return job.counters

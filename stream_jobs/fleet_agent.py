"""The fleet features job as Faust agents: ``FleetRouter`` over the features and decisions
topics, ``FleetJob`` over the fleet-inputs topic with its scope states in a table, and a
timer that publishes every scope's fleet features.

Outputs first, states second, as in the metrics job: a crash in between replays inputs
that the states then recognise (each remembers its recent input ids) and ticks whose
events carry the same ids. A failed delivery is tried again until it is through, and a
batch a job fails on is dead-lettered (``dsec.infra.batch_guard``).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping

from dsec.infra.faust_app import App, StreamT, batch_guard, fetch_topic_metadata, record_of
from dsec.infra.observability.metrics import ProcessMetrics
from dsec.schemas.topics import TopicNames
from dsec.stream_jobs.fleet_features import FleetConfig, FleetState
from dsec.stream_jobs.fleet_job import FleetCounters, FleetJob, FleetRouter
from dsec.stream_jobs.instruments import FleetInstruments

__all__ = ["FLEET_JOB_TABLES", "register_fleet_job"]

FLEET_JOB_TABLES = ("fleet-state",)


class FleetStateTable(MutableMapping[str, FleetState]):
    """Scope states by scope key over a table of bytes keyed by the key's bytes (as on the
    fleet-inputs topic, so the changelog partition is the scope's partition)."""

    def __init__(self, table: MutableMapping[bytes, bytes]) -> None:
        self._table = table

    def __getitem__(self, key: str) -> FleetState:
        return FleetState.from_bytes(self._table[key.encode()])

    def __setitem__(self, key: str, state: FleetState) -> None:
        self._table[key.encode()] = state.to_bytes()

    def __delitem__(self, key: str) -> None:
        del self._table[key.encode()]

    def __iter__(self) -> Iterator[str]:
        return (key.decode() for key in list(self._table))

    def __len__(self) -> int:
        return len(self._table)


def register_fleet_job(
    app: App,
    topics: TopicNames,
    config: FleetConfig | None = None,
    metrics: ProcessMetrics | None = None,
    batch_max_messages: int = 500,
    batch_within_s: float = 0.2,
) -> FleetCounters:
    config = config or FleetConfig()
    counters = FleetCounters()
    instruments = FleetInstruments(metrics or ProcessMetrics(), topics,
                                   ttl_s=5 * config.publish_interval_s)
    router = FleetRouter(topics, counters)
    table = app.Table("fleet-state", partitions=None, key_type=bytes, value_type=bytes,
                      use_partitioner=True)
    job = FleetJob(topics, FleetStateTable(table), config, counters=counters)

    guard = batch_guard(app, "fleet-job", topics.dead_letters)

    sources = app.topic(topics.features, topics.decisions, value_type=bytes, key_type=bytes)

    @app.agent(sources, name="fleet-router")
    async def fleet_router(stream: StreamT) -> None:
        async for events in stream.take_events(batch_max_messages, within=batch_within_s):
            records = [record_of(event) for event in events]
            outputs = await guard.processed(records, router.process)
            if outputs is not None:
                await guard.deliver(outputs)
                instruments.routed(records)

    inputs = app.topic(topics.fleet_inputs, value_type=bytes, key_type=bytes)

    @app.agent(inputs, name="fleet-job")
    async def fleet_job(stream: StreamT) -> None:
        await fetch_topic_metadata(app, table.changelog_topic.get_topic_name())
        async for events in stream.take_events(batch_max_messages, within=batch_within_s):
            records = [record_of(event) for event in events]
            states = await guard.processed(records, job.process)
            if states is not None:
                job.save(states)

    @app.timer(interval=config.publish_interval_s)
    async def publish_fleet_features() -> None:
        tick = job.tick()
        await guard.deliver(tick.outputs)
        job.save(tick.states)
        instruments.ticked(tick)

    return counters

"""The policy engine as Faust agents: batches of the features topic through
``PolicyAgent``, its outputs delivered a topic at a time in the order the agent gives
them, so that a command is delivered before the audit record naming it (a failed delivery
tried again until it is through; a batch the engine fails on dead-lettered:
``dsec.infra.batch_guard``); policies and pools in from their compacted topics,
hot-reloaded. The agent's state mappings are Faust tables."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from dsec.infra.consumer_loop_types import HANDLER_FAILED
from dsec.infra.faust_app import (
    App,
    StreamT,
    Table,
    batch_guard,
    fetch_topic_metadata,
    on_partitions_assigned,
    record_of,
)
from dsec.infra.observability.metrics import ProcessMetrics
from dsec.infra.records import Output, Record
from dsec.policy_engine.instruments import EngineInstruments
from dsec.policy_engine.policy_agent import EngineCounters, PolicyAgent
from dsec.policy_engine.pool_registry import PoolRegistry
from dsec.policy_engine.registry import PolicyRegistry
from dsec.policy_engine.tables import feature_table, knob_table, state_table
from dsec.schemas import PolicyDecision, Signer
from dsec.schemas.topics import TopicNames

__all__ = ["TABLES", "EngineCounters", "EngineOptions", "register_policy_engine"]

TABLES = ("policy-state", "policy-knobs", "policy-features")


@dataclass(frozen=True)
class EngineOptions:
    batch_max_events: int = 2000
    batch_within_s: float = 0.05


def _table(app: App, name: str) -> Table:
    # Raw keys (the worker id's bytes, as on the features topic) and the producer's
    # partitioner: a worker's entries go to the changelog partition of its events.
    return app.Table(name, partitions=None, key_type=bytes, value_type=bytes,
                     use_partitioner=True)


def register_policy_engine(
    app: App,
    topics: TopicNames,
    registry: PolicyRegistry,
    signer: Signer,
    options: EngineOptions | None = None,
    startup_decisions: list[PolicyDecision] | None = None,
    policies_from_offset: int = 0,
    metrics: ProcessMetrics | None = None,
    pools: PoolRegistry | None = None,
    pools_from_offset: int = 0,
) -> EngineCounters:
    """``registry`` holds the built-in pack and the policies topic read up to
    ``policies_from_offset``, ``pools`` the pools topic up to ``pools_from_offset``; the
    agents take the topics on from there."""
    options = options or EngineOptions()
    instruments = EngineInstruments(metrics or ProcessMetrics(), topics)
    features = app.topic(topics.features, value_type=bytes, key_type=bytes)
    policies = app.topic(topics.policies, value_type=bytes, key_type=bytes)
    pool_records = app.topic(topics.pools, value_type=bytes, key_type=bytes)
    tables = tuple(_table(app, name) for name in TABLES)
    agent = PolicyAgent(topics, registry, state_table(tables[0]), knob_table(tables[1]),
                        signer, policies_from_offset, pools, pools_from_offset,
                        known=feature_table(tables[2]))
    # The engine caches its tables in columns: after a rebalance, read them again.
    on_partitions_assigned(app, agent.engine.forget_cached)

    guard = batch_guard(app, "policy-engine", topics.dead_letters,
                        lambda count: instruments.dead_lettered_batch(HANDLER_FAILED, count))

    async def send_durably(output: Output) -> None:
        await guard.deliver([output])

    @app.task
    async def audit_startup() -> None:
        for record in startup_decisions or []:
            await send_durably(agent.audit(record))
            instruments.decisions_out.inc()

    def loader(load: Callable[[Record], Output | None]) -> Callable[[StreamT], Awaitable]:
        async def run(stream: StreamT) -> None:
            async for event in stream.events():
                instruments.policies_in.inc()
                audit = load(record_of(event))
                if audit is not None:
                    await send_durably(audit)
                    instruments.decisions_out.inc()
        return run

    app.agent(policies, name="policy-loader")(loader(agent.load_policy))
    app.agent(pool_records, name="pool-loader")(loader(agent.load_pool))

    @app.agent(features, name="policy-engine")
    async def policy_engine(stream: StreamT) -> None:
        for table in tables:
            await fetch_topic_metadata(app, table.changelog_topic.get_topic_name())
        async for batch in stream.take_events(options.batch_max_events,
                                              within=options.batch_within_s):
            records = [record_of(event) for event in batch]
            # processed once (the state machine moves on), then delivered until every
            # message is through: the commands before the audit records that name them
            out = await guard.processed(records, agent.process)
            if out is not None:
                await guard.deliver(out.messages, in_order=True)
                instruments.batch_done(out)

    return agent.counters

"""The policy engine as Faust agents: features in (in batches), actuation commands and
audit records out; policies in from the compacted policies topic, hot-reloaded.

Per (policy, target) state and per (target, knob) ownership live in Faust tables, so a
restarted engine neither forgets a pending ``for:`` timer or a staged policy nor fires
twice; command ids derive from their cause, so a replayed event repeats the same id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass

import orjson

from dsec.infra.faust_app import (
    App,
    StreamT,
    Table,
    TopicT,
    dead_letter_for,
    fetch_topic_metadata,
)
from dsec.infra.observability.metrics import (
    ACTUATIONS,
    BREAKER_TRIPS,
    EVENTS_DEAD_LETTERED,
    EVENTS_IN,
    EVENTS_OUT,
    MELT_DOWN_COUNT,
    POLICY_EVALUATION_LATENCY,
    ProcessMetrics,
    RecentEvents,
    dead_letter_reason,
    is_breaker_trip,
)
from dsec.policy_engine.engine import Engine, EngineOutput
from dsec.policy_engine.registry import PolicyRegistry
from dsec.schemas import DecodeError, FeatureEvent, PolicyDecision, Signer, decode, encode
from dsec.schemas.topics import TopicNames

log = logging.getLogger(__name__)


TABLES = ("policy-state", "policy-knobs")
SERVICE = "policy-engine"


@dataclass
class EngineCounters:
    features_in: int = 0
    batches: int = 0
    decisions: int = 0
    actuations_out: int = 0
    policies_published: int = 0
    policy_updates: int = 0
    dead_letters: int = 0


@dataclass(frozen=True)
class EngineOptions:
    batch_max_events: int = 2000
    batch_within_s: float = 0.05


class _EngineInstruments:
    """The engine's Prometheus instruments, bound to their labels once; updated per batch."""

    def __init__(self, metrics: ProcessMetrics, topics: TopicNames) -> None:
        events_in, events_out = metrics.counter(EVENTS_IN), metrics.counter(EVENTS_OUT)
        self.features_in = events_in.labels(SERVICE, topics.features)
        self.policies_in = events_in.labels(SERVICE, topics.policies)
        self.actuations_out = events_out.labels(SERVICE, topics.actuations)
        self.decisions_out = events_out.labels(SERVICE, topics.decisions)
        self.policies_out = events_out.labels(SERVICE, topics.policies)
        self.dead_letters_out = events_out.labels(SERVICE, topics.dead_letters)
        self.dead_lettered = metrics.counter(EVENTS_DEAD_LETTERED)
        self.actuations = metrics.counter(ACTUATIONS)
        self.evaluation_latency = metrics.histogram(POLICY_EVALUATION_LATENCY)
        self.breaker_trips = metrics.counter(BREAKER_TRIPS)
        self.recent_trips = RecentEvents(window_s=3600.0)
        metrics.gauge_function(MELT_DOWN_COUNT, self.recent_trips.count)

    def evaluated(self, output: EngineOutput, elapsed_s: float) -> None:
        self.evaluation_latency.observe(elapsed_s)
        kinds: dict[str, int] = {}
        for command in output.commands:
            kinds[command.action.kind.value] = kinds.get(command.action.kind.value, 0) + 1
        for kind, count in kinds.items():
            self.actuations.labels(SERVICE, kind, "emitted").inc(count)
        trips = sum(1 for record in output.decisions
                    if is_breaker_trip(record.policy_name, record.decision))
        if trips:
            self.breaker_trips.inc(trips)
            self.recent_trips.add(trips)


def _table(app: App, name: str) -> Table:
    # Raw keys (the worker id's bytes, as on the features topic) and the producer's
    # partitioner: a worker's entries go to the changelog partition of its events.
    return app.Table(name, partitions=None, key_type=bytes, value_type=bytes,
                     use_partitioner=True)


def worker_of_state(key: str) -> str:
    """The worker of a policy-state key, ``policy|job|worker``."""
    return key.split("|", 2)[2]


def worker_of_knob(key: str) -> str:
    """The worker of a knob key, ``job|worker|knob``."""
    return key.split("|", 2)[1]


class WorkerKeyedTable(MutableMapping[str, dict]):
    """Entries keyed by strings that name their worker, kept in a table of one JSON object
    per worker, under the worker id's bytes: every write of an entry rewrites its worker's
    object. Keys and values are bytes in the table, as they come back on recovery; a worker
    with no entries has no object."""

    def __init__(self, table: MutableMapping[bytes, bytes],
                 worker_of: Callable[[str], str]) -> None:
        self._table = table
        self._worker_of = worker_of

    def _entries(self, worker: bytes) -> dict[str, dict]:
        raw = self._table.get(worker)
        return {} if raw is None else orjson.loads(raw)

    def _store(self, worker: bytes, entries: dict[str, dict]) -> None:
        if entries:
            self._table[worker] = orjson.dumps(entries)
        elif worker in self._table:
            del self._table[worker]

    def __getitem__(self, key: str) -> dict:
        return self._entries(self._worker_of(key).encode())[key]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._entries(self._worker_of(key).encode())

    def __setitem__(self, key: str, value: dict) -> None:
        worker = self._worker_of(key).encode()
        entries = self._entries(worker)
        entries[key] = value
        self._store(worker, entries)

    def __delitem__(self, key: str) -> None:
        worker = self._worker_of(key).encode()
        entries = self._entries(worker)
        del entries[key]
        self._store(worker, entries)

    def __iter__(self) -> Iterator[str]:
        for worker in list(self._table):
            yield from self._entries(worker)

    def __len__(self) -> int:
        return sum(len(self._entries(worker)) for worker in list(self._table))

    def __bool__(self) -> bool:
        return len(self._table) > 0  # no worker keeps an empty object


def register_policy_engine(
    app: App,
    topics: TopicNames,
    registry: PolicyRegistry,
    signer: Signer,
    options: EngineOptions | None = None,
    startup_decisions: list[PolicyDecision] | None = None,
    policies_from_offset: int = 0,
    metrics: ProcessMetrics | None = None,
) -> EngineCounters:
    """``registry`` holds the built-in pack and the policies topic read up to
    ``policies_from_offset``; the agent takes the topic on from there."""
    options = options or EngineOptions()
    counters = EngineCounters()
    instruments = _EngineInstruments(metrics or ProcessMetrics(), topics)
    features = app.topic(topics.features, value_type=bytes, key_type=bytes)
    policies = app.topic(topics.policies, value_type=bytes, key_type=bytes)
    actuations = app.topic(topics.actuations, value_type=bytes, key_type=bytes)
    decisions = app.topic(topics.decisions, value_type=bytes, key_type=bytes)
    dead_letters = app.topic(topics.dead_letters, value_type=bytes, key_type=bytes)
    state_table, knob_table = _table(app, "policy-state"), _table(app, "policy-knobs")
    states = WorkerKeyedTable(state_table, worker_of_state)
    knobs = WorkerKeyedTable(knob_table, worker_of_knob)
    engine = Engine(registry, states, knobs, signer)

    async def send_durably(topic: TopicT, key: bytes, value: bytes | None) -> None:
        await (await topic.send(key=key, value=value))

    async def audit(record: PolicyDecision) -> None:
        await send_durably(decisions, record.policy_name.encode(), encode(record))
        counters.decisions += 1
        instruments.decisions_out.inc()

    @app.task
    async def audit_startup() -> None:
        for record in startup_decisions or []:
            await audit(record)

    @app.agent(policies, name="policy-loader")
    async def policy_loader(stream: StreamT) -> None:
        async for event in stream.events():
            instruments.policies_in.inc()
            if event.message.offset < policies_from_offset:
                continue  # already read at startup
            record = registry.offer(event.key, event.value)
            if record is not None:
                counters.policy_updates += 1
                log.warning("policy %s v%s: %s", record.policy_name, record.policy_version,
                            record.decision)
                await audit(record)

    @app.agent(features, name="policy-engine")
    async def policy_engine(stream: StreamT) -> None:
        for table in (state_table, knob_table):
            await fetch_topic_metadata(app, table.changelog_topic.get_topic_name())
        async for batch in stream.take_events(options.batch_max_events,
                                              within=options.batch_within_s):
            good: list[FeatureEvent] = []
            for event in batch:
                try:
                    feature = decode(event.value, FeatureEvent)
                except DecodeError as exc:
                    counters.dead_letters += 1
                    letter = dead_letter_for(event, exc.reason)
                    await send_durably(dead_letters, event.message.topic.encode(),
                                       encode(letter))
                    instruments.dead_lettered.labels(SERVICE, dead_letter_reason(exc.reason)).inc()
                    instruments.dead_letters_out.inc()
                    continue
                good.append(feature)
            counters.features_in += len(good)
            counters.batches += 1
            instruments.features_in.inc(len(batch))
            started_s = time.perf_counter()
            output = engine.evaluate(good)
            instruments.evaluated(output, time.perf_counter() - started_s)
            for command in output.commands:
                await send_durably(actuations, command.target.node_id.encode(), encode(command))
                counters.actuations_out += 1
            instruments.actuations_out.inc(len(output.commands))
            for successor in output.policies:
                await send_durably(policies, successor.name.encode(), encode(successor))
                counters.policies_published += 1
            instruments.policies_out.inc(len(output.policies))
            for record in output.decisions:
                await audit(record)

    return counters

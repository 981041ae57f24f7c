"""The policy engine as Faust agents: features in (in batches), actuation commands and
audit records out; policies in from the compacted policies topic, hot-reloaded.

Per (policy, target) state and per (target, knob) ownership live in Faust tables, so a
restarted engine neither forgets a pending ``for:`` timer or a staged policy nor fires
twice; command ids derive from their cause, so a replayed event repeats the same id.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass

import faust
import orjson
from faust.streams import _current_event  # the changelog partition comes from it

from dsec.infra.faust_app import dead_letter_for
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
from dsec.schemas import DecodeError, FeatureEvent, PolicyDecision, decode, encode
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


class _ChangelogTable(faust.Table):
    def _verify_source_topic_partitions(self, source_topic: str) -> None:
        # Right after Faust creates the changelog topic the consumer's metadata may not
        # list it yet (0 partitions); check once it does, instead of failing the agent.
        if not self.app.consumer.topic_partitions(self.changelog_topic_name):
            return
        super()._verify_source_topic_partitions(source_topic)


def _table(app: faust.App, name: str) -> faust.Table:
    return app.tables.add(_ChangelogTable(
        app, name=name, beacon=app.tables.beacon, partitions=None,
        key_type=bytes, value_type=bytes,
    ))


class _EventScopedTable(MutableMapping[str, dict]):
    """A Faust table of JSON values written from a batch: each write is attributed to the
    event of the target it concerns, so its changelog record lands in that event's
    partition. Keys and values are bytes in the table, as they come back on recovery."""

    def __init__(self, table: faust.Table, target_of: Callable[[str], str]) -> None:
        self._table = table
        self._target_of = target_of
        self.events: dict[str, faust.EventT] = {}

    def _scoped(self, key: str):
        event = self.events.get(self._target_of(key))
        return _current_event.set(weakref.ref(event)) if event is not None else None

    def __getitem__(self, key: str) -> dict:
        raw = self._table.get(key.encode())
        if raw is None:
            raise KeyError(key)
        return orjson.loads(raw)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.encode() in self._table

    def __setitem__(self, key: str, value: dict) -> None:
        token = self._scoped(key)
        try:
            self._table[key.encode()] = orjson.dumps(value)
        finally:
            if token is not None:
                _current_event.reset(token)

    def __delitem__(self, key: str) -> None:
        token = self._scoped(key)
        try:
            del self._table[key.encode()]
        finally:
            if token is not None:
                _current_event.reset(token)

    def __iter__(self) -> Iterator[str]:
        return (key.decode() for key in self._table)

    def __len__(self) -> int:
        return len(self._table)


def register_policy_engine(
    app: faust.App,
    topics: TopicNames,
    registry: PolicyRegistry,
    signing_key: bytes,
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
    states = _EventScopedTable(_table(app, "policy-state"), lambda key: key.split("|", 1)[1])
    knobs = _EventScopedTable(_table(app, "policy-knobs"), lambda key: key.rsplit("|", 1)[0])
    engine = Engine(registry, states, knobs, signing_key)

    async def send_durably(topic: faust.TopicT, key: bytes, value: bytes | None) -> None:
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
    async def policy_loader(stream: faust.StreamT) -> None:
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
    async def policy_engine(stream: faust.StreamT) -> None:
        async for batch in stream.take_events(options.batch_max_events,
                                              within=options.batch_within_s):
            good: list[FeatureEvent] = []
            states.events.clear()
            knobs.events.clear()
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
                target = f"{feature.identity.job_id}|{feature.identity.worker_id}"
                states.events[target] = knobs.events[target] = event
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

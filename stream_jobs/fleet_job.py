"""The fleet features job as two stages without a broker.

``FleetRouter`` reads the worker feature events and the policy decisions and says, for
each, what it adds to the worker's pool and to its whole job: a ``FleetInput`` keyed by
the scope, so that one scope's inputs meet in one partition however the workers are
spread. Breaker trips are read from the decisions, not the commands: a trip is one
``fired`` decision of a breaker, however many commands its stage sends (none in dry run).

``FleetJob`` takes those inputs into per-scope ``FleetState``s (a Faust table in the
stream job, a dict in tests) and, at each ``tick``, gives every scope's fleet feature
event. As with the metrics job, the caller publishes the outputs, then saves the states,
then commits the offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field

from dsec.infra.observability.metrics import is_breaker_trip
from dsec.infra.records import Output, Record
from dsec.schemas import DecodeError, FeatureEvent, PolicyDecision, decode, now_ms
from dsec.schemas.feature_columns import feature_events
from dsec.schemas.features import fleet_identity
from dsec.schemas.fleet import FLEET_INPUT_FEATURES, FleetInput
from dsec.schemas.topics import TopicNames
from dsec.stream_jobs.fleet_features import (
    FleetConfig,
    FleetState,
    add_input,
    fleet_features,
    forget_departed,
    window_name,
)
from dsec.stream_jobs.metrics_job import derived_event_id

__all__ = ["FleetCounters", "FleetJob", "FleetRouter", "FleetTick", "scope_of"]

log = logging.getLogger(__name__)


@dataclass
class FleetCounters:
    records_in: int = 0
    undecodable: int = 0
    inputs_out: int = 0
    inputs_in: int = 0
    features_out: int = 0


class FleetRouter:
    def __init__(self, topics: TopicNames, counters: FleetCounters | None = None) -> None:
        self.topics = topics
        self.counters = counters or FleetCounters()

    def process(self, records: Iterable[Record]) -> list[Output]:
        """The inputs of the features and decisions records, in their order. A record
        that does not decode is counted and skipped here: the policy engine dead-letters
        the features topic's, the alert notifier the decisions topic's."""
        outputs: list[Output] = []
        for record in records:
            self.counters.records_in += 1
            try:
                outputs.extend(self._route(record))
            except DecodeError as exc:
                self.counters.undecodable += 1
                log.warning("fleet router: skipping %s@%d:%d: %s", record.topic,
                            record.partition, record.offset, exc.reason)
        self.counters.inputs_out += len(outputs)
        return outputs

    def _route(self, record: Record) -> list[Output]:
        if record.topic == self.topics.decisions:
            decision = decode(record.value, PolicyDecision)
            if decision.identity is None or not is_breaker_trip(decision.policy_name,
                                                                 decision.decision):
                return []
            return self._inputs(decision.event_id, decision.event_time_ms, decision.identity,
                                decision.identity.pool, {}, breaker_trip=True)
        outputs = []
        for event in feature_events(record.value):
            if event.scope != "worker":  # the fleet's own events come back on this topic
                continue
            readings = {name: event.features[name] for name in FLEET_INPUT_FEATURES
                        if name in event.features}
            outputs += self._inputs(event.event_id, event.event_time_ms, event.identity,
                                    event.target_pool(), readings)
        return outputs

    def _inputs(self, source_id: str, event_time_ms: int, worker, pool: str | None,
                readings: dict[str, float], breaker_trip: bool = False) -> list[Output]:
        scopes: list[tuple[str, str | None]] = [("job", None)]
        if pool:
            scopes.append(("pool", pool))
        outputs = []
        for scope, scope_pool in scopes:
            item = FleetInput(
                event_id=derived_event_id("fleet-input", source_id, scope),
                event_time_ms=event_time_ms, scope=scope, job_id=worker.job_id,
                pool=scope_pool, worker=worker, readings=readings, breaker_trip=breaker_trip)
            outputs.append(Output(self.topics.fleet_inputs, item.scope_key().encode(), item))
        return outputs


@dataclass
class FleetTick:
    """A tick's fleet feature events, and the scope states to save once they are out
    (``None``: the scope has nothing left and its entry goes)."""

    outputs: list[Output] = field(default_factory=list)
    states: dict[str, FleetState | None] = field(default_factory=dict)

    @property
    def events(self) -> list[FeatureEvent]:
        return [output.event for output in self.outputs]  # type: ignore[misc]


class FleetJob:
    def __init__(
        self,
        topics: TopicNames,
        states: MutableMapping[str, FleetState],
        config: FleetConfig | None = None,
        clock_ms: Callable[[], int] = now_ms,
        counters: FleetCounters | None = None,
    ) -> None:
        """``states``: scope key -> state. ``clock_ms``: stamps each fleet feature event."""
        self.topics = topics
        self.states = states
        self.config = config or FleetConfig()
        self.clock_ms = clock_ms
        self.counters = counters or FleetCounters()

    def process(self, records: Iterable[Record]) -> dict[str, FleetState]:
        """The scopes' new states after a batch of the fleet-inputs topic (to ``save``)."""
        changed: dict[str, FleetState] = {}
        for record in records:
            try:
                item = decode(record.value, FleetInput)
            except DecodeError as exc:  # only the router writes here
                self.counters.undecodable += 1
                log.warning("fleet job: skipping %s@%d:%d: %s", record.topic,
                            record.partition, record.offset, exc.reason)
                continue
            self.counters.inputs_in += 1
            key = item.scope_key()
            state = changed.get(key) or self.states.get(key) or FleetState()
            changed[key] = add_input(state, item, self.config)
        return changed

    def save(self, states: dict[str, FleetState | None]) -> None:
        for key, state in states.items():
            if state is None:
                self.states.pop(key, None)
            else:
                self.states[key] = state

    def tick(self, at_ms: int | None = None) -> FleetTick:
        """Every scope's features over the window ending now (``at_ms``)."""
        at_ms = self.clock_ms() if at_ms is None else at_ms
        tick = FleetTick()
        for key, state in list(self.states.items()):
            kept = forget_departed(state, at_ms, self.config)
            if not kept.workers and not kept.buckets:
                tick.states[key] = None
                continue
            if kept is not state:
                tick.states[key] = kept
            scope, job_id, pool = scope_of(key)
            values = fleet_features(kept, at_ms, self.config)
            identity = fleet_identity(job_id, pool)
            event = FeatureEvent(
                event_id=derived_event_id("fleet", key, at_ms), event_time_ms=at_ms,
                identity=identity, scope=scope, window=window_name(self.config.window_s),
                features=values, tags={"pool": pool} if pool else {})
            tick.outputs.append(Output(self.topics.features, identity.worker_id.encode(),
                                       event))
        self.counters.features_out += len(tick.outputs)
        return tick


def scope_of(key: str) -> tuple[str, str, str | None]:
    """(scope, job, pool) of a scope key: ``<job>|pool:<pool>`` or ``<job>|job``."""
    job_id, _, target = key.rpartition("|")
    if target.startswith("pool:"):
        return "pool", job_id, target.removeprefix("pool:")
    return "job", job_id, None

"""The policy agent as a stage, without Faust or a broker: feature records in; commands,
audit records, tuned policies and pools and dead letters out, in the order they are to be
published.

Per (policy, target) state, per (target, knob) ownership and per target last known
features live in the mappings it is given (Faust tables in the stream job, dicts in
tests), so a restarted engine neither forgets a pending ``for:`` timer or a staged policy
nor fires twice; command ids derive from their cause, so a replayed event repeats the
same id. The engine runs on the features' event times alone: no wall clock is read here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field

from dsec.infra.records import Output, Record
from dsec.policy_engine.decide import PolicyState
from dsec.policy_engine.engine import Engine, EngineOutput
from dsec.policy_engine.feature_batch import FeatureBatch
from dsec.policy_engine.feature_memory import KnownFeatures
from dsec.policy_engine.knobs import KnobEntry
from dsec.policy_engine.pool_registry import PoolRegistry
from dsec.policy_engine.registry import PolicyRegistry
from dsec.schemas import (
    ActuationCommand,
    DeadLetter,
    DecodeError,
    FeatureEvent,
    PolicyDecision,
    PolicySpec,
    PoolSpec,
    Signer,
)
from dsec.schemas.feature_columns import decode_features
from dsec.schemas.policies import policy_key
from dsec.schemas.topics import TopicNames

__all__ = ["AgentOutput", "EngineCounters", "PolicyAgent"]

log = logging.getLogger(__name__)


@dataclass
class EngineCounters:
    features_in: int = 0
    batches: int = 0
    decisions: int = 0
    actuations_out: int = 0
    policies_published: int = 0
    pools_published: int = 0
    policy_updates: int = 0
    dead_letters: int = 0


@dataclass
class AgentOutput:
    """One batch's outputs: ``messages``, every one in publication order (dead letters,
    commands, tuned policies and pools, then the audit records); ``evaluated``, what the
    engine decided, and ``evaluation_s``, how long that took; ``events_in``, the feature
    events the batch's messages held."""

    dead_letters: list[DeadLetter] = field(default_factory=list)
    evaluated: EngineOutput = field(default_factory=EngineOutput)
    messages: list[Output] = field(default_factory=list)
    evaluation_s: float = 0.0
    events_in: int = 0

    @property
    def commands(self) -> list[ActuationCommand]:
        return self.evaluated.commands

    @property
    def decisions(self) -> list[PolicyDecision]:
        return self.evaluated.decisions

    @property
    def policies(self) -> list[PolicySpec]:
        return self.evaluated.policies

    @property
    def pools(self) -> list[PoolSpec]:
        return self.evaluated.pools


class PolicyAgent:
    def __init__(
        self,
        topics: TopicNames,
        registry: PolicyRegistry,
        states: MutableMapping[str, PolicyState],
        knobs: MutableMapping[str, KnobEntry],
        signer: Signer,
        policies_from_offset: int = 0,
        pools: PoolRegistry | None = None,
        pools_from_offset: int = 0,
        known: MutableMapping[str, KnownFeatures] | None = None,
    ) -> None:
        """``registry`` holds the built-in pack and the policies topic read up to
        ``policies_from_offset``, ``pools`` the pools topic read up to ``pools_from_offset``;
        ``load_policy`` and ``load_pool`` take the topics on from there. ``known``: each
        target's last known features (a dict when not given)."""
        self.topics = topics
        self.registry = registry
        self.pools = pools if pools is not None else PoolRegistry(registry.verifier)
        self.engine = Engine(registry, states, knobs, signer, self.pools, known)
        self.policies_from_offset = policies_from_offset
        self.pools_from_offset = pools_from_offset
        self.counters = EngineCounters()

    def process(self, records: Sequence[Record]) -> AgentOutput:
        """A batch of the features topic (single events and ``FeatureColumns`` messages);
        a record that is neither is dead-lettered with its reason, and the others'
        events are evaluated in order."""
        out = AgentOutput()
        parts: list[FeatureBatch] = []
        single: list[FeatureEvent] = []
        letters: list[Output] = []
        for record in records:
            try:
                decoded = decode_features(record.value)
            except DecodeError as exc:
                out.dead_letters.append(record.dead_letter(exc.reason))
                letters.append(Output(self.topics.dead_letters, record.topic.encode(),
                                      out.dead_letters[-1]))
                continue
            if isinstance(decoded, FeatureEvent):
                single.append(decoded)
                continue
            if single:
                parts.append(FeatureBatch.from_events(single))
                single = []
            parts.append(FeatureBatch.from_rows(decoded))
        if single or not parts:
            parts.append(FeatureBatch.from_events(single))
        batch = FeatureBatch.concat(parts)
        self.counters.dead_letters += len(out.dead_letters)
        out.events_in = len(batch)
        self.counters.features_in += len(batch)
        self.counters.batches += 1
        started_s = time.perf_counter()
        out.evaluated = self.engine.evaluate_batch(batch)
        out.evaluation_s = time.perf_counter() - started_s
        evaluated = out.evaluated
        out.messages = [
            *letters,
            *(Output(self.topics.actuations, c.target.node_id.encode(), c)
              for c in evaluated.commands),
            *(Output(self.topics.policies, policy_key(p.name, p.pool).encode(), p)
              for p in evaluated.policies),
            *(Output(self.topics.pools, p.name.encode(), p) for p in evaluated.pools),
            *(self.audit(record) for record in evaluated.decisions),
        ]
        self.counters.actuations_out += len(evaluated.commands)
        self.counters.policies_published += len(evaluated.policies)
        self.counters.pools_published += len(evaluated.pools)
        return out

    def load_policy(self, record: Record) -> Output | None:
        """A record of the policies topic: the audit record of what installing it decided,
        if anything; records below ``policies_from_offset`` were read at startup."""
        return self._load(record, self.policies_from_offset, self.registry.offer)

    def load_pool(self, record: Record) -> Output | None:
        """The same for a record of the pools topic (nothing for a version this engine
        tuned and installed already)."""
        return self._load(record, self.pools_from_offset, self.pools.offer)

    def _load(self, record: Record, from_offset: int,
              offer: Callable[[bytes | None, bytes | None], PolicyDecision | None],
              ) -> Output | None:
        if record.offset < from_offset:
            return None
        decision = offer(record.key, record.value)
        if decision is None:
            return None
        self.counters.policy_updates += 1
        log.warning("%s v%s: %s", decision.policy_name, decision.policy_version,
                    decision.decision)
        return self.audit(decision)

    def audit(self, record: PolicyDecision) -> Output:
        self.counters.decisions += 1
        return Output(self.topics.decisions, record.policy_name.encode(), record)

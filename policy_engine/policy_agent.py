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
from dsec.schemas.feature_columns import FeatureRows, decode_features
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


class _Pending:
    """A batch's feature events as they are decoded, given back as engine steps of at most
    ``max_rows`` rows (a larger message of columns alone), in order: a backlog of large
    messages is neither held whole nor evaluated in one step."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.parts: list[FeatureBatch] = []
        self.rows = 0
        self.single: list[FeatureEvent] = []

    def add(self, decoded: FeatureEvent | FeatureRows) -> list[FeatureBatch]:
        if isinstance(decoded, FeatureEvent):
            steps = self._step() if self._held() >= self.max_rows else []
            self.single.append(decoded)
            return steps
        part = FeatureBatch.from_rows(decoded)
        steps = self._step() if self._held() + len(part) > self.max_rows else []
        self._close_single()
        self.parts.append(part)
        self.rows += len(part)
        if self.rows >= self.max_rows:
            steps += self._step()
        return steps

    def _held(self) -> int:
        return self.rows + len(self.single)

    def finish(self) -> list[FeatureBatch]:
        return self._step()

    def _close_single(self) -> None:
        if self.single:
            self.parts.append(FeatureBatch.from_events(self.single))
            self.rows += len(self.single)
            self.single = []

    def _step(self) -> list[FeatureBatch]:
        self._close_single()
        if not self.parts:
            return []
        step = FeatureBatch.concat(self.parts)
        self.parts, self.rows = [], 0
        return [step]


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
        max_rows_per_step: int = 20_000,
    ) -> None:
        """``registry`` holds the built-in pack and the policies topic read up to
        ``policies_from_offset``, ``pools`` the pools topic read up to ``pools_from_offset``;
        ``load_policy`` and ``load_pool`` take the topics on from there. ``known``: each
        target's last known features (a dict when not given). ``max_rows_per_step``: a
        batch of more feature events (a backlog of messages of columns) is evaluated in
        steps of at most that many, whole messages each, in order."""
        self.topics = topics
        self.registry = registry
        self.pools = pools if pools is not None else PoolRegistry(registry.verifier)
        self.engine = Engine(registry, states, knobs, signer, self.pools, known)
        self.policies_from_offset = policies_from_offset
        self.pools_from_offset = pools_from_offset
        self.counters = EngineCounters()
        self.max_rows_per_step = max_rows_per_step

    def process(self, records: Sequence[Record]) -> AgentOutput:
        """A batch of the features topic (single events and ``FeatureColumns`` messages);
        a record that is neither is dead-lettered with its reason, and the others'
        events are evaluated in order."""
        out = AgentOutput()
        letters: list[Output] = []
        pending = _Pending(self.max_rows_per_step)
        for record in records:
            try:
                decoded = decode_features(record.value)
            except DecodeError as exc:
                out.dead_letters.append(record.dead_letter(exc.reason))
                letters.append(Output(self.topics.dead_letters, record.topic.encode(),
                                      out.dead_letters[-1]))
                continue
            for step in pending.add(decoded):
                self._evaluate(step, out)
        for step in pending.finish():
            self._evaluate(step, out)
        self.counters.dead_letters += len(out.dead_letters)
        self.counters.features_in += out.events_in
        self.counters.batches += 1
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

    def _evaluate(self, step: FeatureBatch, out: AgentOutput) -> None:
        started_s = time.perf_counter()
        done = self.engine.evaluate_batch(step)
        out.evaluation_s += time.perf_counter() - started_s
        out.events_in += len(step)
        for name in ("commands", "decisions", "policies", "pools"):
            getattr(out.evaluated, name).extend(getattr(done, name))

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

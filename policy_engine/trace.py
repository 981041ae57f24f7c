"""Offline evaluation: run policies over a recorded trace of feature events (JSON lines)
with the same engine the stream job runs, and report what they would have done."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from dsec.policy_engine.decide import PolicyState
from dsec.policy_engine.engine import Engine, EngineOutput
from dsec.policy_engine.feature_memory import KnownFeatures
from dsec.policy_engine.pool_registry import PoolRegistry
from dsec.policy_engine.registry import PolicyRegistry, PolicyRejected
from dsec.schemas import DecodeError, FeatureEvent, PolicySpec, PoolSpec
from dsec.schemas.feature_columns import feature_events
from dsec.schemas.signing import HmacSigner, HmacVerifier


@dataclass
class Replay:
    output: EngineOutput = field(default_factory=EngineOutput)
    events: int = 0
    states: dict[str, PolicyState] = field(default_factory=dict)


def read_trace(path: Path) -> Iterator[FeatureEvent]:
    """The events of a file of features-topic messages, one a line (a ``FeatureEvent`` or
    a ``FeatureColumns`` message)."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                events = feature_events(line.strip())
            except DecodeError as exc:
                raise DecodeError(f"{path}:{number}: {exc.reason}") from None
            yield from events


def replay(
    policies: Iterable[PolicySpec], events: Iterable[FeatureEvent], batch_size: int = 1,
    pools: Iterable[PoolSpec] = (),
    known: MutableMapping[str, KnownFeatures] | None = None,
) -> Replay:
    """Event-time order, ``batch_size`` events per evaluation; a meta-policy's new
    versions take effect at once, as they would once back from the policies and pools
    topics. ``known``: the targets' last known features to start from and to keep (a
    fresh memory when not given)."""
    # Offline: the policies and pools are trusted as given, signed with a key of the
    # moment's, and what the engine signs goes nowhere.
    signer = HmacSigner(secrets.token_bytes(32))
    registry = PolicyRegistry(HmacVerifier(signer.key))
    for policy in policies:
        decision = registry.install(signer.sign(policy))
        if decision is not None and decision.decision == "policy_rejected":
            raise PolicyRejected(f"{policy.name}: {decision.detail}")
    pool_registry = PoolRegistry(registry.verifier)
    for pool in pools:
        decision = pool_registry.install(signer.sign(pool))
        if decision is not None and decision.decision == "pool_rejected":
            raise PolicyRejected(f"pool {pool.name}: {decision.detail}")
    result = Replay()
    engine = Engine(registry, result.states, {}, signer, pool_registry, known)
    ordered = sorted(events, key=lambda e: e.event_time_ms)
    for start in range(0, len(ordered), batch_size):
        batch = ordered[start:start + batch_size]
        result.events += len(batch)
        step = engine.evaluate(batch)
        for successor in step.policies:
            registry.install(successor)
        result.output.commands += step.commands
        result.output.decisions += step.decisions
        result.output.policies += step.policies
        result.output.pools += step.pools
    return result

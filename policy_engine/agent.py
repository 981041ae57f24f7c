"""The policy engine as a Faust agent: features in, actuation commands and audit records out.

Per (policy, target) state lives in a Faust table, so a restarted engine neither
forgets a pending ``for:`` timer nor fires twice inside a cooldown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import faust

from dsec.policy_engine.conditions import CompiledCondition, ConditionError
from dsec.policy_engine.decide import PolicyState, decide
from dsec.schemas import (
    ActuationCommand,
    DecodeError,
    FeatureEvent,
    PolicyDecision,
    PolicySpec,
    decode,
    encode,
    new_event_id,
    sign,
)
from dsec.schemas.policies import DecisionKind
from dsec.schemas.topics import TopicNames
from dsec.stream_jobs.metrics_job import dead_letter_for

log = logging.getLogger(__name__)


@dataclass
class EngineCounters:
    features_in: int = 0
    decisions: int = 0
    actuations_out: int = 0
    dead_letters: int = 0


def build_command(
    policy: PolicySpec, feature: FeatureEvent, now_ms: int, signing_key: bytes
) -> ActuationCommand:
    command = ActuationCommand(
        actuation_id=new_event_id(),
        event_time_ms=now_ms,
        target=feature.identity,
        expires_at_ms=now_ms + int(policy.action.ttl_s * 1000),
        policy_name=policy.name,
        policy_version=policy.version,
        action=policy.action.params,
        reason=f"{policy.name} v{policy.version}: {policy.condition}",
    )
    return sign(command, signing_key)


def register_policy_engine(
    app: faust.App, topics: TopicNames, policies: list[PolicySpec], signing_key: bytes
) -> EngineCounters:
    counters = EngineCounters()
    compiled = [(policy, CompiledCondition(policy.condition)) for policy in policies]
    features = app.topic(topics.features, value_type=bytes, key_type=bytes)
    actuations = app.topic(topics.actuations, value_type=bytes, key_type=bytes)
    decisions = app.topic(topics.decisions, value_type=bytes, key_type=bytes)
    dead_letters = app.topic(topics.dead_letters, value_type=bytes, key_type=bytes)
    policy_state = app.Table("policy-state", default=dict, partitions=None)

    async def send_durably(topic: faust.TopicT, key: bytes, value: bytes) -> None:
        await (await topic.send(key=key, value=value))

    @app.agent(features, name="policy-engine")
    async def policy_engine(stream: faust.StreamT) -> None:
        async for event in stream.events():
            try:
                feature = decode(event.value, FeatureEvent)
            except DecodeError as exc:
                counters.dead_letters += 1
                letter = dead_letter_for(event, exc.reason)
                await send_durably(dead_letters, event.message.topic.encode(), encode(letter))
                continue
            counters.features_in += 1
            now_ms = feature.event_time_ms
            for policy, condition in compiled:
                key = f"{policy.name}|{feature.identity.job_id}|{feature.identity.worker_id}"
                state = PolicyState.from_json(policy_state[key])
                try:
                    holds = condition.holds(feature.features)
                except ConditionError as exc:
                    await send_durably(decisions, policy.name.encode(), encode(PolicyDecision(
                        policy_name=policy.name, policy_version=policy.version,
                        identity=feature.identity, decision=DecisionKind.EVALUATION_ERROR,
                        detail=str(exc)[:2048],
                    )))
                    continue
                new_state, decision = decide(policy, state, holds, now_ms)
                if new_state != state:
                    policy_state[key] = new_state.to_json()
                if decision is None:
                    continue
                actuation_id = None
                if decision is DecisionKind.FIRED:
                    command = build_command(policy, feature, now_ms, signing_key)
                    actuation_id = command.actuation_id
                    await send_durably(
                        actuations, feature.identity.node_id.encode(), encode(command)
                    )
                    counters.actuations_out += 1
                record = PolicyDecision(
                    policy_name=policy.name,
                    policy_version=policy.version,
                    identity=feature.identity,
                    decision=decision,
                    actuation_id=actuation_id,
                    detail=f"features: {feature.features}"[:2048],
                )
                await send_durably(decisions, policy.name.encode(), encode(record))
                counters.decisions += 1

    return counters

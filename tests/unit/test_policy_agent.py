"""The policy agent as a stage, without Faust or a broker: feature records in; commands,
audit records, tuned policies and dead letters out, over state mappings it is given."""

from __future__ import annotations

import orjson
from feature_values import GIB, HEALTHY
from feature_values import STUCK as STUCK_RUN
from keys import KEYRING, VERIFIER

from dsec.infra.records import Record
from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.decide import PolicyState
from dsec.policy_engine.knobs import KnobEntry
from dsec.policy_engine.policy_agent import PolicyAgent
from dsec.policy_engine.registry import PolicyRegistry
from dsec.policy_engine.tables import knob_table, state_table
from dsec.schemas import FeatureEvent, WorkerIdentity, encode
from dsec.schemas.policies import DecisionKind
from dsec.schemas.topics import topic_names

TOPICS = topic_names("t")
PACK = {policy.name: policy for policy in load_builtin_policies()}
STUCK = {**HEALTHY, **STUCK_RUN}


def _agent(names: tuple[str, ...], states=None, knobs=None, from_offset: int = 0) -> PolicyAgent:
    registry = PolicyRegistry(VERIFIER)
    for name in names:
        registry.install_trusted(PACK[name])
    return PolicyAgent(TOPICS, registry, {} if states is None else states,
                       {} if knobs is None else knobs, KEYRING, from_offset)


def _records(features: dict[str, float], seconds: int, start_ms: int = 1_000_000,
             worker: str = "w1", first_offset: int = 0) -> list[Record]:
    identity = WorkerIdentity(job_id="job", worker_id=worker, node_id="node-1")
    events = [FeatureEvent(event_id=f"feature-{worker}-{t:06d}", identity=identity,
                           event_time_ms=start_ms + t * 1000, features=features,
                           tags={"episode_end_reason": "collision"})
              for t in range(0, seconds, 5)]
    return [Record(TOPICS.features, 0, first_offset + i, worker.encode(), encode(event))
            for i, event in enumerate(events)]


def test_a_stuck_worker_gets_its_commands_then_their_audit_records_in_order() -> None:
    out = _agent(("stuck-episode",)).process(_records(STUCK, 10))
    kinds = [command.action.kind for command in out.commands]
    assert kinds == ["memory_cap", "sync_priority"]
    assert out.commands[0].action.limit_bytes == 4 * GIB
    assert [(m.topic, m.key) for m in out.messages] == [
        (TOPICS.actuations, b"node-1"), (TOPICS.actuations, b"node-1"),
        (TOPICS.decisions, b"stuck-episode"), (TOPICS.decisions, b"stuck-episode")]
    assert [m.event for m in out.messages[:2]] == out.commands
    assert [d.decision for d in out.decisions] == [DecisionKind.FIRED] * 2
    assert [d.actuation_id for d in out.decisions] == [c.actuation_id for c in out.commands]
    assert all(c.target.worker_id == "w1" and c.signature for c in out.commands)


def test_a_healthy_worker_gets_nothing() -> None:
    # periodic-snapshot fires on any live worker
    out = _agent(tuple(set(PACK) - {"periodic-snapshot"})).process(_records(HEALTHY, 60))
    assert out.messages == [] and out.dead_letters == []


def test_bad_records_are_dead_lettered_first_and_the_good_ones_evaluated() -> None:
    bad = Record(TOPICS.features, 4, 17, b"w1", b'{"identity": 1}')
    agent = _agent(("stuck-episode",))
    out = agent.process([bad, *_records(STUCK, 10)])
    (letter,) = out.dead_letters
    assert (letter.source_topic, letter.partition, letter.offset) == (TOPICS.features, 4, 17)
    assert "FeatureEvent" in letter.reason
    first = out.messages[0]
    assert (first.topic, first.key, first.event) == (TOPICS.dead_letters, TOPICS.features.encode(),
                                                     letter)
    assert len(out.commands) == 2
    assert agent.counters.dead_letters == 1 and agent.counters.features_in == 2


def test_a_restarted_agent_over_the_same_tables_does_not_fire_twice() -> None:
    state_bytes: dict[bytes, bytes] = {}
    knob_bytes: dict[bytes, bytes] = {}
    first = _agent(("stuck-episode",), state_table(state_bytes), knob_table(knob_bytes))
    fired = first.process(_records(STUCK, 10))
    assert len(fired.commands) == 2
    assert list(state_bytes) == [b"w1"] and list(knob_bytes) == [b"w1"]
    entries = orjson.loads(state_bytes[b"w1"])
    assert list(entries) == ["stuck-episode|job|w1"]
    restarted = _agent(("stuck-episode",), state_table(state_bytes), knob_table(knob_bytes))
    again = restarted.process(_records(STUCK, 10))  # replayed after a crash
    assert again.messages == []  # stage 1 is in force: nothing to decide


def test_state_kept_as_table_bytes_decides_as_state_kept_in_objects() -> None:
    names = ("worker-lost", "stuck-episode", "bandwidth-latency-breaker")
    lost = {**STUCK, "worker_lost": 1.0, "grad_sync_latency_p95_ms": 120.0}
    batches = [_records(lost, 30), _records(STUCK, 300, start_ms=1_030_000),
               _records(HEALTHY, 400, start_ms=1_330_000)]
    in_objects = _agent(names)
    in_bytes = _agent(names, state_table({}), knob_table({}))
    for batch in batches:
        a, b = in_objects.process(batch), in_bytes.process(batch)
        assert [(c.actuation_id, c.action) for c in a.commands] == [
            (c.actuation_id, c.action) for c in b.commands]
        assert [(d.decision, d.detail) for d in a.decisions] == [
            (d.decision, d.detail) for d in b.decisions]
    assert isinstance(in_objects.engine.states, dict)
    assert all(isinstance(s, PolicyState) for s in in_objects.engine.states.values())
    assert all(isinstance(k, KnobEntry) for k in in_objects.engine.knobs.values())
    assert dict(in_bytes.engine.states) == in_objects.engine.states
    assert dict(in_bytes.engine.knobs) == in_objects.engine.knobs


def test_a_knob_entry_reads_back_as_written() -> None:
    agent = _agent(("worker-lost", "stuck-episode"))
    agent.process(_records({**STUCK, "worker_lost": 1.0}, 10))
    entry = agent.engine.knobs["job|w1|sync_priority"]
    assert entry.applied == "worker-lost" and list(entry.claims) == ["worker-lost",
                                                                      "stuck-episode"]
    assert KnobEntry.from_json(orjson.loads(orjson.dumps(entry.to_json()))) == entry


def test_policies_load_from_the_topic_past_the_startup_offset() -> None:
    agent = _agent((), from_offset=5)
    policy = encode(KEYRING.sign(PACK["stuck-episode"]))  # as dsec policy publish does
    assert agent.load_policy(Record(TOPICS.policies, 0, 4, b"stuck-episode", policy)) is None
    assert agent.registry.get("stuck-episode") is None  # read at startup already
    audit = agent.load_policy(Record(TOPICS.policies, 0, 5, b"stuck-episode", policy))
    assert audit is not None and (audit.topic, audit.key) == (TOPICS.decisions,
                                                              b"stuck-episode")
    assert audit.event.decision == DecisionKind.POLICY_ACCEPTED
    assert agent.registry.get("stuck-episode") is not None
    forged = agent.load_policy(Record(TOPICS.policies, 0, 6, b"stuck-episode", b"{}"))
    assert forged is not None and forged.event.decision == DecisionKind.POLICY_REJECTED

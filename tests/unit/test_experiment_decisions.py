"""The goodput experiment's decision count: the decisions topic read to its end by a
bounded ConsumerLoop, on the in-memory consumer double."""

from __future__ import annotations

import pytest
from consumer_double import InMemoryLog

from dsec.experiment.decisions import DecisionsUnreadable, count_decisions
from dsec.schemas import PolicyDecision, WorkerIdentity, encode, topic_names
from dsec.schemas.policies import DecisionKind
from dsec.schemas.settings import DsecSettings

SETTINGS = DsecSettings(bootstrap="127.0.0.1:1", topic_prefix="arm")
TOPIC = topic_names("arm").decisions
T0_S = 1_800_000_000.0


def _decision(policy: str, kind: DecisionKind, after_s: float, worker: str = "w0") -> bytes:
    return encode(PolicyDecision(
        policy_name=policy, policy_version=1, decision=kind,
        identity=WorkerIdentity(job_id="job", node_id="n0", worker_id=worker),
        event_time_ms=int((T0_S + after_s) * 1000), detail="why"))


def test_decisions_are_counted_and_the_acting_ones_timed() -> None:
    log = InMemoryLog()
    values = [
        _decision("memory-cap", DecisionKind.FIRED, 12.0, "w1"),
        _decision("memory-cap", DecisionKind.SUPPRESSED_COOLDOWN, 13.0),
        _decision("periodic-snapshot", DecisionKind.FIRED, 5.0),  # on a clock: untimed
        _decision("memory-cap", DecisionKind.POLICY_ACCEPTED, 0.0),  # not about a worker
        _decision("precision-downgrade", DecisionKind.DRY_RUN, 3.5),
    ]
    for n, value in enumerate(values):
        log.append(TOPIC, value, partition=n % 2, partitions=2)
    counts, timeline = count_decisions(SETTINGS, T0_S, consumer_factory=log.consumer)
    assert counts == {"memory-cap:fired": 1, "memory-cap:suppressed_cooldown": 1,
                      "periodic-snapshot:fired": 1, "precision-downgrade:dry_run": 1}
    assert [(e["t"], e["policy"], e["decision"], e["worker"]) for e in timeline] == [
        (3.5, "precision-downgrade", "dry_run", "w0"), (12.0, "memory-cap", "fired", "w1")]
    assert log.commits == []


def test_a_record_that_is_not_a_decision_is_named() -> None:
    log = InMemoryLog()
    log.append(TOPIC, _decision("memory-cap", DecisionKind.FIRED, 1.0))
    log.append(TOPIC, b"not a decision")
    with pytest.raises(DecisionsUnreadable, match=f"{TOPIC}@0:1"):
        count_decisions(SETTINGS, T0_S, consumer_factory=log.consumer)

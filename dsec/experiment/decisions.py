"""An arm's policy decisions after its run: the decisions topic read whole, as it stands,
by a bounded ``ConsumerLoop`` (every partition assigned from the beginning, read to the
end it had when the read began, nothing committed)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Message

from dsec.infra.consumer_loop import BatchWriter, ConsumerLoop, ConsumerLoopConfig, Start
from dsec.infra.kafka_clients import consumer_config
from dsec.schemas import PolicyDecision, decode, topic_names
from dsec.schemas.policies import DecisionKind
from dsec.schemas.settings import DsecSettings
from dsec.schemas.units import ms_to_s

log = logging.getLogger(__name__)
# Records of the policy set itself, not decisions about a worker.
POLICY_RECORDS = frozenset({DecisionKind.POLICY_ACCEPTED, DecisionKind.POLICY_DELETED,
                            DecisionKind.POLICY_REJECTED})
ACTING = frozenset({DecisionKind.FIRED, DecisionKind.DRY_RUN})
UNTIMED_POLICY = "periodic-snapshot"  # acts on a clock: its decisions say nothing of faults
READ_TIMEOUT_S = 90.0  # the partitions' end offsets (asked again while the broker is busy)
METADATA_TIMEOUT_S = 60.0


class DecisionsUnreadable(RuntimeError):
    """A record on the decisions topic is not a decision."""


@dataclass
class DecisionCounts(BatchWriter[list[PolicyDecision]]):
    """Decisions by ``policy:kind``, and when each decision to act (fired, or dry run) was
    taken, in seconds from ``t0_s``, except the periodic snapshot's."""

    t0_s: float
    counts: dict[str, int] = field(default_factory=dict)
    timeline: list[dict] = field(default_factory=list)

    def prepare(self, messages: Sequence[Message]) -> list[PolicyDecision]:
        return [decode(message.value(), PolicyDecision) for message in messages]

    def write(self, batch: list[PolicyDecision]) -> None:
        for decision in batch:
            kind = decision.decision
            if kind in POLICY_RECORDS:
                continue
            name = f"{decision.policy_name}:{kind.value}"
            self.counts[name] = self.counts.get(name, 0) + 1
            if kind in ACTING and decision.policy_name != UNTIMED_POLICY:
                self.timeline.append({
                    "t": round(ms_to_s(decision.event_time_ms) - self.t0_s, 2),
                    "policy": decision.policy_name, "decision": kind.value,
                    "stage": decision.stage,
                    "worker": decision.identity.worker_id if decision.identity else None,
                    "detail": decision.detail[:160]})


def _unreadable(message: Message, reason: str) -> None:
    raise DecisionsUnreadable(
        f"{message.topic()}@{message.partition()}:{message.offset()}: {reason}")


def count_decisions(settings: DsecSettings, t0_s: float,
                    consumer_factory: Callable[[dict], Any] = Consumer,
                    ) -> tuple[dict[str, int], list[dict]]:
    """The arm's decisions by ``policy:kind``, and its timeline of decisions to act, in
    the order they were taken. A read cut short by ``READ_TIMEOUT_S`` gives what it read."""
    topic = topic_names(settings.topic_prefix).decisions
    group = f"{settings.topic_prefix}-experiment-count"  # assigned: never joins it
    counts = DecisionCounts(t0_s)
    loop = ConsumerLoop(
        ConsumerLoopConfig((topic,), group, poll_timeout_s=0.5, start=Start.BEGINNING,
                           assign=True, until_end=True, commit=False,
                           metadata_timeout_s=METADATA_TIMEOUT_S),
        consumer_config(settings, group), counts, _unreadable, service="experiment-count",
        consumer_factory=consumer_factory)
    if not loop.run(timeout_s=READ_TIMEOUT_S):
        log.warning("%s not read to its end in %.0f s; counting what was read", topic,
                    READ_TIMEOUT_S)
    return counts.counts, sorted(counts.timeline, key=lambda entry: entry["t"])

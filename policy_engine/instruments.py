"""The policy engine's Prometheus instruments, bound to their labels once; updated per
batch from what the policy agent gave."""

from __future__ import annotations

from dsec.infra.observability.metrics import (
    ACTUATIONS,
    BREAKER_TRIPS,
    EVENTS_DEAD_LETTERED,
    EVENTS_IN,
    EVENTS_OUT,
    POLICY_EVALUATION_LATENCY,
    ProcessMetrics,
    dead_letter_reason,
    is_breaker_trip,
)
from dsec.policy_engine.policy_agent import AgentOutput
from dsec.schemas.topics import TopicNames

SERVICE = "policy-engine"


class EngineInstruments:
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
        # Trips per hour and pool (dsec_melt_down_count) come from the fleet features.
        self.breaker_trips = metrics.counter(BREAKER_TRIPS)

    def dead_lettered_batch(self, reason_class: str, messages: int) -> None:
        """A batch the engine failed on, its messages dead-lettered."""
        self.dead_lettered.labels(SERVICE, reason_class).inc(messages)
        self.dead_letters_out.inc(messages)

    def batch_done(self, out: AgentOutput) -> None:
        """Counts in the batch's feature events (a message of columns holds many) and the
        messages it dead-lettered."""
        self.features_in.inc(out.events_in + len(out.dead_letters))
        for letter in out.dead_letters:
            self.dead_lettered.labels(SERVICE, dead_letter_reason(letter.reason)).inc()
        self.dead_letters_out.inc(len(out.dead_letters))
        self.evaluation_latency.observe(out.evaluation_s)
        kinds: dict[str, int] = {}
        for command in out.commands:
            kinds[command.action.kind.value] = kinds.get(command.action.kind.value, 0) + 1
        for kind, count in kinds.items():
            self.actuations.labels(SERVICE, kind, "emitted").inc(count)
        trips = sum(1 for record in out.decisions
                    if is_breaker_trip(record.policy_name, record.decision))
        if trips:
            self.breaker_trips.inc(trips)
        self.actuations_out.inc(len(out.commands))
        self.policies_out.inc(len(out.policies))
        self.decisions_out.inc(len(out.decisions))

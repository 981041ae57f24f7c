"""The detection bench's traces through the same stages in one process, without a broker:
the metrics job, the card job and the policy agent over dicts, in trace time. For the
unit tests and for quick looks while tuning; the figures reported come from the real
stack (``detection.run_detection_bench``)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from dsec.bench.detection_score import Firing
from dsec.bench.detection_traces import DetectionTrace
from dsec.infra.records import Record
from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.policy_agent import PolicyAgent
from dsec.policy_engine.registry import PolicyRegistry
from dsec.schemas import encode, topic_names
from dsec.schemas.policies import DecisionKind
from dsec.schemas.signing import HmacSigner, HmacVerifier
from dsec.stream_jobs.card_job import CardJob
from dsec.stream_jobs.metrics_job import MetricsJob

__all__ = ["OfflineRun", "run_offline"]


@dataclass
class OfflineRun:
    firings: list[Firing] = field(default_factory=list)
    commands: list[Firing] = field(default_factory=list)
    decisions: int = 0
    dead_letters: int = 0


def run_offline(traces: Sequence[DetectionTrace], start_ms: int, preroll_s: float,
                interval_s: float, preroll_interval_s: float = 10.0) -> OfflineRun:
    """A healthy history of ``preroll_s`` before ``start_ms``, then each trace's faults
    from ``start_ms`` on (``DetectionTrace.start``), every message ``interval_s`` apart."""
    topics = topic_names("offline")
    now = [start_ms]
    metrics = MetricsJob(topics, {}, clock_ms=lambda: now[0])
    cards = CardJob(topics, {}, clock_ms=lambda: now[0])
    # Offline: what the engine signs goes nowhere.
    signer = HmacSigner(secrets.token_bytes(32))
    registry = PolicyRegistry(HmacVerifier(signer.key))
    for policy in load_builtin_policies():
        registry.install_trusted(policy)
    agent = PolicyAgent(topics, registry, {}, {}, signer)
    run = OfflineRun()
    offset = [0]

    def records(topic: str, documents) -> list[Record]:
        out = []
        for document in documents:
            out.append(Record(topic, 0, offset[0], document["identity"]["worker_id"].encode(),
                              orjson.dumps(document)))
            offset[0] += 1
        return out

    def step(a_ms: int, b_ms: int, interval_ms: int, heartbeat_first: bool,
             scored: bool) -> None:
        for tick in range(a_ms, b_ms, interval_ms):
            now[0] = min(tick + interval_ms, b_ms)
            documents = [d for trace in traces
                         for d in trace.documents(tick, now[0], interval_ms,
                                                  heartbeat_first and tick == a_ms)]
            result = metrics.process(records(topics.metrics, documents), now[0])
            metrics.save(result.states)
            run.dead_letters += len(result.dead_letter_reasons)
            card_records = [Record(o.topic, 0, offset[0] + i, o.key, encode(o.event))
                            for i, o in enumerate(result.card_reports)]
            offset[0] += len(card_records)
            told, states = cards.process(card_records)
            cards.save(states)
            features = [o for o in [*result.feature_columns, *told]
                        if o.topic == topics.features]
            out = agent.process([Record(o.topic, 0, 0, o.key, encode(o.event))
                                 for o in features])
            run.decisions += len(out.decisions)
            if not scored:
                continue
            for decision in out.decisions:
                if decision.decision is DecisionKind.FIRED and decision.identity is not None:
                    run.firings.append(Firing(decision.event_time_ms, decision.policy_name,
                                              decision.identity.job_id,
                                              decision.identity.worker_id))
            run.commands += [Firing(c.event_time_ms, c.policy_name, c.target.job_id,
                                    c.target.worker_id) for c in out.commands]

    preroll_ms = int(preroll_s * 1000)
    step(start_ms - preroll_ms, start_ms, int(preroll_interval_s * 1000), False, False)
    for trace in traces:
        trace.start(start_ms)
    end_ms = max(trace.end_ms for trace in traces)
    step(start_ms, end_ms, int(interval_s * 1000), True, True)
    return run

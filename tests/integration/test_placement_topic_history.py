"""Placement's history read whole from the compacted topics on the real broker (a stack
that runs the personality job without a sink, as the goodput experiment's arms do): the
latest record per key wins, an unreadable record or a tombstone is passed over, and the
recommendation API answers from it over HTTP."""

from __future__ import annotations

import pytest

from dsec.experiment.recommend_api import RecommendationServer
from dsec.infra.kafka_clients import make_producer
from dsec.infra.topics import ensure_topics
from dsec.placement.api import HistorySource
from dsec.placement.topic_history import read_topic_history, topic_history
from dsec.schemas import encode, now_ms, topic_names
from dsec.schemas.alerts import GpuHealthEvent
from dsec.schemas.placement import (
    GpuPersonalityEvent,
    GpuTopologyEvent,
    RegimeStats,
    WorkloadAffinityEvent,
)

pytestmark = pytest.mark.integration


def _personality(at_ms: int, uuid: str, model: str, score: float) -> GpuPersonalityEvent:
    return GpuPersonalityEvent(
        event_time_ms=at_ms, scope="gpu", gpu_uuid=uuid, gpu_model=model,
        regimes={"all": RegimeStats(observed_s=60.0, workers=1)},
        stability_score={"all": score}, first_seen_ms=at_ms, last_seen_ms=at_ms)


def test_the_history_is_read_from_the_topics_and_the_api_answers_from_it(settings) -> None:
    ensure_topics(settings, partitions=1)
    topics = topic_names(settings.topic_prefix)
    at_ms = now_ms()
    producer = make_producer(settings, "test-placement-history")
    records = [(topics.gpu_topology, GpuTopologyEvent(
        event_time_ms=at_ms, node_id="node-1", gpu_uuid=uuid, gpu_model=model, gpu_index=i))
        for i, (uuid, model) in enumerate((("gpu-a", "A"), ("gpu-b", "B"), ("gpu-c", "B")))]
    records += [
        (topics.gpu_personalities, _personality(at_ms, "gpu-a", "A", 0.9)),
        (topics.gpu_personalities, _personality(at_ms + 1000, "gpu-a", "A", 0.1)),  # later
        (topics.gpu_personalities, _personality(at_ms, "gpu-b", "B", 0.95)),
        (topics.workload_affinity, WorkloadAffinityEvent(
            event_time_ms=at_ms, workload="ppo", gpu_model="A", ooms=2, observed_s=60.0,
            first_seen_ms=at_ms, last_seen_ms=at_ms)),
        (topics.gpu_health, GpuHealthEvent(
            event_time_ms=at_ms, gpu_uuid="gpu-c", gpu_model="B", state="degraded",
            since_ms=at_ms, signal="thermal_throttle", policy_name="gpu-health"))]
    for topic, event in records:
        producer.produce(topic, key=event.gpu_uuid.encode() if hasattr(event, "gpu_uuid")
                         else b"ppo/A", value=encode(event))
    producer.produce(topics.gpu_personalities, key=b"gpu:junk", value=b"not an event")
    producer.produce(topics.gpu_personalities, key=b"gpu:gone", value=None)
    assert producer.flush(30) == 0

    history = read_topic_history(settings)
    assert set(history.topology) == {"gpu-a", "gpu-b", "gpu-c"}
    assert history.gpus["gpu-a"].regimes["all"]["stability_score"] == 0.1
    assert history.affinity[("ppo", "A")].ooms == 2
    assert history.health["gpu-c"].state == "degraded"

    with RecommendationServer(HistorySource(topic_history(settings), refresh_s=0.0)) as api:
        answer = api.recommend({"workload": "ppo"})
    assert [gpu["gpu_uuid"] for gpu in answer["ranked"]] == ["gpu-b", "gpu-a"]
    assert [gpu["gpu_uuid"] for gpu in answer["filtered"]] == ["gpu-c"]

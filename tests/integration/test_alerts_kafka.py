"""Alerts that reach people, on the real broker and chDB: a stuck worker's alert reaches a
real HTTP receiver in Alertmanager's webhook format once, and its resolution once the
episodes vary again; a throttling GPU is recorded as degraded, then healthy."""

from __future__ import annotations

import json
import uuid

import pytest
from feature_values import HEALTHY
from feature_values import STUCK as STUCK_RUN
from helpers import start_stack, stop_stack, wait_for
from webhook_server import RecordingWebhook

from dsec.history import query
from dsec.infra.kafka_clients import make_producer
from dsec.schemas import FeatureEvent, WorkerIdentity, encode, now_ms, topic_names
from dsec.schemas.settings import DsecSettings

pytestmark = pytest.mark.integration
STUCK = "Agent_42_episode_stuck_collision_3x"
# A card throttling now, after two onsets.
HOT = {"gpu_thermal_throttle_events": 2.0, "gpu_thermal_throttled": 1.0}


def _events(worker: str, features: dict, seconds: int, start_ms: int, **tags: str):
    identity = WorkerIdentity(job_id="alert-job", worker_id=worker, node_id="node-1",
                              pool="A")
    return [FeatureEvent(identity=identity, event_time_ms=start_ms + t * 1000,
                         gpu_uuid=f"GPU-{worker}", features=features,
                         tags={"gpu_model": "NVIDIA H100", **tags})
            for t in range(0, seconds, 5)]


def test_alert_reaches_a_receiver_once_and_its_resolution_follows(kafka_bootstrap,
                                                                  tmp_path) -> None:
    settings = DsecSettings(bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                            data_dir=tmp_path / "stack")
    topics = topic_names(settings.topic_prefix)
    receiver = RecordingWebhook(answer=b"")
    start_ms = now_ms() - 300_000
    # Worker 42's episodes end at the same place for 30 s, then vary for 2 minutes (the
    # stuck-episode policy comes down after 60 s calm); GPU-hot throttles for 10 s, then
    # not any more.
    features = [
        *_events("42", {**HEALTHY, **STUCK_RUN}, 30, start_ms,
                 episode_end_reason="collision"),
        *_events("42", HEALTHY, 120, start_ms + 30_000, episode_end_reason="timeout"),
        *_events("hot", {**HEALTHY, **HOT}, 10, start_ms),
        *_events("hot", HEALTHY, 20, start_ms + 10_000),
    ]
    stack = start_stack(kafka_bootstrap, settings.data_dir, settings.topic_prefix,
                        env={"DSEC_ALERT_WEBHOOK_URLS": json.dumps([receiver.url])})
    try:
        producer = make_producer(settings, "test-features")
        for event in sorted(features, key=lambda e: e.event_time_ms):
            producer.produce(topics.features, key=event.identity.worker_id.encode(),
                             value=encode(event))
        assert producer.flush(30) == 0

        def notified() -> list[dict] | None:
            posted = [json.loads(body) for body in receiver.bodies]
            stuck = [p for p in posted if p["groupLabels"]["alertname"] == STUCK]
            gpu = [p for p in posted if p["groupLabels"]["alertname"] == "GPU_GPU-hot_degraded"]
            return posted if len(stuck) == 2 and len(gpu) == 2 else None

        posted = wait_for(notified, 180, interval_s=1, what="the alerts and resolutions")
        stuck = [p for p in posted if p["groupLabels"]["alertname"] == STUCK]
        assert [p["status"] for p in stuck] == ["firing", "resolved"]
        for payload in stuck:
            assert payload["version"] == "4" and payload["receiver"] == "dsec"
            assert payload["groupKey"] == '{}:{alertname="' + STUCK + '"}'
            (alert,) = payload["alerts"]
            assert alert["labels"]["worker"] == "42" and alert["labels"]["pool"] == "A"
            assert alert["labels"]["gpu_uuid"] == "GPU-42"
        firing, resolved = (p["alerts"][0] for p in stuck)
        assert firing["fingerprint"] == resolved["fingerprint"]
        assert firing["startsAt"] == resolved["startsAt"]
        assert firing["endsAt"] == "0001-01-01T00:00:00Z" < resolved["endsAt"]

        def stored() -> list | None:
            rows = query(settings, "SELECT alertname, status FROM alerts ORDER BY event_time, "
                                   "status")["rows"]
            gpus = query(settings, "SELECT gpu_uuid, gpu_model, state, signal FROM gpu_health "
                                   "ORDER BY event_time")["rows"]
            return [rows, gpus] if len(rows) == 4 and len(gpus) == 2 else None

        alerts, gpus = wait_for(stored, 60, interval_s=1, what="alerts and GPU health stored")
        assert sorted(map(tuple, alerts)) == [("Agent_42_episode_stuck_collision_3x", "firing"),
                                              ("Agent_42_episode_stuck_collision_3x", "resolved"),
                                              ("GPU_GPU-hot_degraded", "firing"),
                                              ("GPU_GPU-hot_degraded", "resolved")]
        assert gpus == [["GPU-hot", "NVIDIA H100", "degraded", "thermal_throttle"],
                        ["GPU-hot", "NVIDIA H100", "healthy", ""]]
        named = query(settings, "SELECT DISTINCT gpu_uuid, gpu_model FROM policy_decisions "
                                "WHERE policy_name = 'gpu-degradation-snapshot' "
                                "AND decision IN ('fired', 'resolved')")["rows"]
        assert named == [["GPU-hot", "NVIDIA H100"]]
        # once, even a while later
        assert len(receiver.bodies) == 4
    finally:
        stop_stack(stack)
        receiver.close()

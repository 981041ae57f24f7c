"""Alerts and GPU health from policy decisions, and their Alertmanager payload (pure)."""

from __future__ import annotations

from feature_values import HEALTHY, STUCK

from dsec.policy_engine.alerts import AlertTracker, readings_of, signal_of
from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.trace import replay
from dsec.schemas import FeatureEvent, WorkerIdentity
from dsec.schemas.alerts import AlertStatus
from dsec.schemas.policies import DecisionKind, PolicyDecision
from dsec.services.alertmanager import ZERO_TIME, rfc3339, webhook_payload

# A card throttling now, after two onsets.
HOT = {"gpu_thermal_throttle_events": 2.0, "gpu_thermal_throttled": 1.0}
WORKER = WorkerIdentity(job_id="job", worker_id="42", node_id="node-1", pool="A")


def _trace(features: dict, seconds: int, start_ms: int, tags: dict | None = None):
    return [FeatureEvent(identity=WORKER, event_time_ms=start_ms + t * 1000, gpu_uuid="GPU-7",
                         features=features,
                         tags={"episode_end_reason": "collision", "gpu_model": "H100",
                               **(tags or {})})
            for t in range(0, seconds, 5)]


def _decisions(policy: str, events) -> list[PolicyDecision]:
    pack = [p for p in load_builtin_policies() if p.name == policy]
    return replay(pack, events).output.decisions


def test_a_staged_alert_fires_once_and_is_resolved_once_with_its_firing_labels() -> None:
    stuck = _trace({**HEALTHY, **STUCK}, 30, 1_000_000)
    # it comes down once calm for hold_s (60 s); by then the episodes end elsewhere
    calm = _trace(HEALTHY, 120, 1_030_000, tags={"episode_end_reason": "timeout"})
    tracker = AlertTracker()
    decisions = _decisions("stuck-episode", stuck + calm)
    changes = [change for d in decisions + decisions for change in tracker.process(d)]
    firing, resolved = changes
    assert (firing.status, resolved.status) == (AlertStatus.FIRING, AlertStatus.RESOLVED)
    assert firing.alertname == "Agent_42_episode_stuck_collision_3x"
    assert firing.labels == {
        "alertname": "Agent_42_episode_stuck_collision_3x", "policy": "stuck-episode",
        "job": "job", "worker": "42", "node": "node-1", "pool": "A", "severity": "warning",
        "gpu_uuid": "GPU-7", "gpu_model": "H100"}
    assert resolved.fingerprint == firing.fingerprint and resolved.labels == firing.labels
    assert resolved.starts_at_ms == firing.starts_at_ms == 1_000_000
    assert resolved.ends_at_ms is not None and resolved.ends_at_ms > 1_030_000
    assert tracker.firing == {}


def test_a_degraded_gpu_is_recorded_with_its_signal_and_healthy_again_once_resolved() -> None:
    hot = _trace({**HEALTHY, **HOT}, 10, 1_000_000)
    cool = _trace(HEALTHY, 10, 1_010_000)
    tracker = AlertTracker()
    changes = [c for d in _decisions("gpu-degradation-snapshot", hot + cool)
               for c in tracker.process(d)]
    firing, degraded, resolved, healthy = changes
    assert firing.alertname == "GPU_GPU-7_degraded"
    assert (degraded.gpu_uuid, degraded.gpu_model, degraded.state, degraded.signal) == (
        "GPU-7", "H100", "degraded", "thermal_throttle")
    assert degraded.since_ms == 1_000_000
    assert "gpu_thermal_throttled=1" in degraded.reason
    assert resolved.status is AlertStatus.RESOLVED
    assert (healthy.state, healthy.since_ms) == ("healthy", 1_010_000)


def test_the_state_is_rebuilt_from_the_topics_in_any_order() -> None:
    stuck = _trace({**HEALTHY, **STUCK}, 10, 1_000_000)
    first = AlertTracker()
    firing = [c for d in _decisions("stuck-episode", stuck) for c in first.process(d)]
    restarted = AlertTracker()
    restarted.restore(reversed(firing), [])
    assert restarted.firing == first.firing
    # what the restarted one reads again announces nothing twice
    assert [c for d in _decisions("stuck-episode", stuck) for c in restarted.process(d)] == []


def test_decisions_without_an_alert_change_nothing() -> None:
    decision = PolicyDecision(policy_name="periodic-snapshot", policy_version=1,
                              identity=WORKER, decision=DecisionKind.FIRED)
    assert AlertTracker().process(decision) == []


def test_readings_and_signals() -> None:
    detail = "alert X; gpu_thermal_throttle_events=0, grad_sync_latency_p99_ms=512.5"
    readings = readings_of(detail)
    assert readings == {"gpu_thermal_throttle_events": 0.0, "grad_sync_latency_p99_ms": 512.5}
    assert signal_of(readings) == "sync_latency_anomaly"
    assert signal_of({}) == "policy_condition"
    # the card throttling now, as the card job tells a worker that does not sample it
    assert signal_of({"card_thermal_throttled": 1.0, **readings}) == "thermal_throttle"


def test_alertmanager_webhook_payload() -> None:
    stuck = _trace({**HEALTHY, **STUCK}, 10, 1_700_000_000_000)
    calm = _trace(HEALTHY, 120, 1_700_000_010_000)
    tracker = AlertTracker()
    firing, resolved = [c for d in _decisions("stuck-episode", stuck + calm)
                        for c in tracker.process(d)]
    body = webhook_payload(firing, "dsec")
    assert set(body) == {"version", "groupKey", "truncatedAlerts", "status", "receiver",
                         "groupLabels", "commonLabels", "commonAnnotations", "externalURL",
                         "alerts"}
    assert body["version"] == "4" and body["status"] == "firing"
    assert body["groupKey"] == '{}:{alertname="Agent_42_episode_stuck_collision_3x"}'
    (alert,) = body["alerts"]
    assert alert["startsAt"] == "2023-11-14T22:13:20.000Z" == rfc3339(1_700_000_000_000)
    assert alert["endsAt"] == ZERO_TIME
    assert alert["fingerprint"] == firing.fingerprint and alert["labels"] == firing.labels
    done = webhook_payload(resolved, "dsec")
    assert done["status"] == "resolved" and done["alerts"][0]["endsAt"] != ZERO_TIME

"""Policy decisions as alerts and GPU health: which alerts start and end, and which GPUs
turn degraded or healthy again.

Pure apart from the state it keeps (what fires, which GPUs are degraded), which
``restore`` rebuilds from the alerts and GPU-health topics: an alert fires once when its
policy fires for a target and is resolved once when the policy comes down for it (the
last stage undone, or a ``resolved`` decision of a policy that fires once per cooldown),
however often the decisions are read. A resolution carries the labels, fingerprint and
start of the firing it ends, whatever the alert's text renders to by then.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from dsec.policy_engine.engine import actuation_id
from dsec.schemas.alerts import AlertEvent, AlertStatus, GpuHealthEvent
from dsec.schemas.policies import DecisionKind, PolicyDecision

__all__ = ["AlertConfig", "AlertTracker", "alert_fingerprint", "readings_of", "signal_of"]

_THROTTLE_READINGS = ("gpu_thermal_throttle_events", "gpu_thermal_throttled",
                      "card_thermal_throttled")
_READING = re.compile(r"\b([a-z][a-z0-9_]*)=(-?[0-9][0-9.e+-]*|nan|inf)")


@dataclass(frozen=True)
class AlertConfig:
    """``gpu_policies``: the policies whose alert says the GPU itself is degraded."""

    gpu_policies: frozenset[str] = frozenset({"gpu-degradation-snapshot"})
    severity: str = "warning"


def alert_fingerprint(labels: dict[str, str]) -> str:
    """A stable hash of the labels, as Alertmanager identifies an alert by its labels."""
    text = "\x00".join(f"{k}\x01{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def readings_of(detail: str) -> dict[str, float]:
    """The ``feature=value`` readings the engine writes into a decision's detail."""
    out = {}
    for name, text in _READING.findall(detail):
        try:
            out[name] = float(text)
        except ValueError:
            continue
    return out


def signal_of(readings: dict[str, float]) -> str:
    """Which signal showed a GPU degraded: thermal throttling first (throttle onsets, or
    the card throttling now as its own probe or the card job tells it), then a
    gradient-sync time anomaly (p99 far above p50), else the policy's condition as a whole."""
    if any(readings.get(name, 0.0) > 0 for name in _THROTTLE_READINGS):
        return "thermal_throttle"
    if "grad_sync_latency_p99_ms" in readings:
        return "sync_latency_anomaly"
    return "policy_condition"


def _target(decision: PolicyDecision) -> str | None:
    identity = decision.identity
    if identity is None:
        return None
    return f"{decision.policy_name}|{identity.job_id}|{identity.worker_id}"


def _starts(decision: PolicyDecision) -> bool:
    return decision.decision is DecisionKind.FIRED


def _ends(decision: PolicyDecision) -> bool:
    return decision.decision is DecisionKind.RESOLVED or (
        decision.decision is DecisionKind.STAGED_DOWN and decision.stage == 0)


class AlertTracker:
    def __init__(self, config: AlertConfig | None = None) -> None:
        self.config = config or AlertConfig()
        self.firing: dict[str, AlertEvent] = {}  # target -> its firing alert
        # target -> when its last alert ended: a decision from before then, read again
        # after a restart, starts nothing
        self.ended_ms: dict[str, int] = {}
        self.degraded: dict[str, GpuHealthEvent] = {}  # GPU UUID -> its degraded record

    def restore(self, alerts: Iterable[AlertEvent], gpus: Iterable[GpuHealthEvent]) -> None:
        """The state the topics hold, read in any order across their partitions: the latest
        event of each alert and of each GPU decides."""
        latest: dict[str, AlertEvent] = {}
        for alert in alerts:
            held = latest.get(alert.fingerprint)
            if held is None or _order(alert) >= _order(held):
                latest[alert.fingerprint] = alert
        for alert in latest.values():
            target = _alert_target(alert)
            if alert.ends_at_ms is not None:
                self.ended_ms[target] = max(self.ended_ms.get(target, 0), alert.ends_at_ms)
            held = self.firing.get(target)
            if alert.status is AlertStatus.FIRING and (
                    held is None or alert.starts_at_ms > held.starts_at_ms):
                self.firing[target] = alert
        newest: dict[str, GpuHealthEvent] = {}
        for gpu in gpus:
            held_gpu = newest.get(gpu.gpu_uuid)
            if held_gpu is None or gpu.event_time_ms >= held_gpu.event_time_ms:
                newest[gpu.gpu_uuid] = gpu
        self.degraded.update({uuid: gpu for uuid, gpu in newest.items()
                              if gpu.state == "degraded"})

    def process(self, decision: PolicyDecision) -> list[AlertEvent | GpuHealthEvent]:
        """What ``decision`` changes: at most one alert event and one GPU-health event."""
        target = _target(decision)
        if target is None or decision.alert is None:
            return []
        out: list[AlertEvent | GpuHealthEvent] = []
        if (_starts(decision) and target not in self.firing
                and decision.event_time_ms > self.ended_ms.get(target, -1)):
            alert = self._firing(decision)
            self.firing[target] = alert
            out.append(alert)
        elif _ends(decision) and target in self.firing:
            alert = self._resolved(self.firing.pop(target), decision)
            self.ended_ms[target] = alert.ends_at_ms or decision.event_time_ms
            out.append(alert)
        else:
            return []
        gpu = self._gpu_health(decision, out[0])
        if gpu is not None:
            out.append(gpu)
        return out

    def _firing(self, decision: PolicyDecision) -> AlertEvent:
        identity = decision.identity
        assert identity is not None and decision.alert is not None
        labels = {"alertname": decision.alert, "policy": decision.policy_name,
                  "job": identity.job_id, "worker": identity.worker_id,
                  "node": identity.node_id, "severity": self.config.severity}
        if identity.pool:
            labels["pool"] = identity.pool
        if decision.gpu_uuid:
            labels["gpu_uuid"] = decision.gpu_uuid
        if decision.gpu_model:
            labels["gpu_model"] = decision.gpu_model
        fingerprint = alert_fingerprint(labels)
        return AlertEvent(
            event_id=actuation_id("alert", fingerprint, "firing", decision.event_time_ms),
            event_time_ms=decision.event_time_ms, fingerprint=fingerprint,
            status=AlertStatus.FIRING, alertname=decision.alert,
            policy_name=decision.policy_name, policy_version=decision.policy_version,
            identity=identity, labels=labels,
            annotations={"summary": decision.alert, "description": decision.detail,
                         "decision_id": decision.event_id},
            starts_at_ms=decision.event_time_ms)

    @staticmethod
    def _resolved(firing: AlertEvent, decision: PolicyDecision) -> AlertEvent:
        return firing.model_copy(update={
            "event_id": actuation_id("alert", firing.fingerprint, "resolved",
                                     firing.starts_at_ms),
            "event_time_ms": decision.event_time_ms, "status": AlertStatus.RESOLVED,
            "policy_version": decision.policy_version,
            "annotations": {**firing.annotations, "resolution": decision.detail,
                            "decision_id": decision.event_id},
            "ends_at_ms": max(decision.event_time_ms, firing.starts_at_ms)})

    def _gpu_health(self, decision: PolicyDecision, alert: AlertEvent) -> GpuHealthEvent | None:
        gpu_uuid = alert.labels.get("gpu_uuid")
        if decision.policy_name not in self.config.gpu_policies or not gpu_uuid:
            return None
        if alert.status is AlertStatus.FIRING:
            if gpu_uuid in self.degraded:
                return None
            readings = readings_of(decision.detail)
            record = GpuHealthEvent(
                event_id=actuation_id("gpu-health", gpu_uuid, "degraded",
                                      decision.event_time_ms),
                event_time_ms=decision.event_time_ms, gpu_uuid=gpu_uuid,
                gpu_model=alert.labels.get("gpu_model", ""), state="degraded",
                since_ms=decision.event_time_ms, signal=signal_of(readings),
                reason=decision.detail, policy_name=decision.policy_name,
                identity=decision.identity)
            self.degraded[gpu_uuid] = record
            return record
        if self.degraded.pop(gpu_uuid, None) is None:
            return None
        return GpuHealthEvent(
            event_id=actuation_id("gpu-health", gpu_uuid, "healthy", decision.event_time_ms),
            event_time_ms=decision.event_time_ms, gpu_uuid=gpu_uuid,
            gpu_model=alert.labels.get("gpu_model", ""), state="healthy",
            since_ms=decision.event_time_ms, signal="", reason=decision.detail,
            policy_name=decision.policy_name, identity=decision.identity)


def _order(alert: AlertEvent) -> tuple[int, int, bool]:
    """Later starts first, then later events, a resolution after the firing it ends."""
    return alert.starts_at_ms, alert.event_time_ms, alert.status is AlertStatus.RESOLVED


def _alert_target(alert: AlertEvent) -> str:
    return f"{alert.policy_name}|{alert.labels.get('job', '')}|{alert.labels.get('worker', '')}"

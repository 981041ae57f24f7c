"""Events → ClickHouse rows: one pure function per table, no I/O."""

from __future__ import annotations

from datetime import datetime

import orjson

from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    DeadLetter,
    FeatureEvent,
    GpuProfileEvent,
    PolicyDecision,
)
from dsec.schemas.alerts import AlertEvent, GpuHealthEvent
from dsec.schemas.placement import GpuPersonalityEvent, GpuTopologyEvent, WorkloadAffinityEvent
from dsec.schemas.units import from_epoch_ms
from dsec.schemas.usage import ProcessUsage

Row = list


def ms_to_datetime(epoch_ms: int) -> datetime:
    return from_epoch_ms(epoch_ms)


FEATURE_COLUMNS = [
    "event_time", "event_id", "job_id", "node_id", "worker_id", "gpu_uuid", "window",
    "feature", "value", "pool",
]


def feature_rows(event: FeatureEvent) -> list[Row]:
    identity = event.identity
    when = ms_to_datetime(event.event_time_ms)
    pool = event.target_pool() or ""
    return [
        [when, event.event_id, identity.job_id, identity.node_id, identity.worker_id,
         event.gpu_uuid or "", event.window, name, value, pool]
        for name, value in sorted(event.features.items())
    ]


ACTUATION_COLUMNS = [
    "event_time", "actuation_id", "expires_at", "job_id", "node_id", "worker_id",
    "policy_name", "policy_version", "action", "params", "reason",
]


def actuation_rows(command: ActuationCommand) -> list[Row]:
    target = command.target
    params = orjson.dumps(command.action.model_dump(mode="json")).decode()
    return [[
        ms_to_datetime(command.event_time_ms), command.actuation_id,
        ms_to_datetime(command.expires_at_ms), target.job_id, target.node_id, target.worker_id,
        command.policy_name, command.policy_version, command.action.kind.value, params,
        command.reason,
    ]]


RESULT_COLUMNS = [
    "event_time", "event_id", "actuation_id", "job_id", "node_id", "worker_id", "action",
    "status", "detail", "command_time", "requested", "in_force",
]


def result_rows(result: ActuationResult) -> list[Row]:
    identity = result.identity
    command_time = (
        ms_to_datetime(result.command_time_ms) if result.command_time_ms is not None else None
    )
    return [[
        ms_to_datetime(result.event_time_ms), result.event_id, result.actuation_id,
        identity.job_id, identity.node_id, identity.worker_id, result.action_kind,
        result.status.value, result.detail, command_time, result.requested, result.in_force,
    ]]


DECISION_COLUMNS = [
    "event_time", "event_id", "policy_name", "policy_version", "job_id", "node_id",
    "worker_id", "decision", "stage", "actuation_id", "detail", "alert", "gpu_uuid",
    "gpu_model",
]


def decision_rows(decision: PolicyDecision) -> list[Row]:
    identity = decision.identity
    return [[
        ms_to_datetime(decision.event_time_ms), decision.event_id, decision.policy_name,
        decision.policy_version, identity.job_id if identity else "",
        identity.node_id if identity else "", identity.worker_id if identity else "",
        decision.decision.value, decision.stage or 0, decision.actuation_id or "", decision.detail,
        decision.alert or "", decision.gpu_uuid or "", decision.gpu_model,
    ]]


DEAD_LETTER_COLUMNS = [
    "event_time", "event_id", "source_topic", "partition", "offset", "reason", "payload",
    "payload_encoding",
]


def dead_letter_rows(letter: DeadLetter) -> list[Row]:
    return [[
        ms_to_datetime(letter.event_time_ms), letter.event_id, letter.source_topic,
        letter.partition, letter.offset, letter.reason, letter.payload, letter.payload_encoding,
    ]]


GPU_PROFILE_COLUMNS = [
    "event_time", "event_id", "gpu_uuid", "gpu_model", "job_id", "node_id", "worker_id",
    "regime", "delta_bytes", "delta_s", "thermal_throttle_events", "bandwidth_jitter", "samples",
]


def gpu_profile_rows(profile: GpuProfileEvent) -> list[Row]:
    identity = profile.identity
    when = ms_to_datetime(profile.event_time_ms)
    return [
        [when, profile.event_id, profile.gpu_uuid, profile.gpu_model, identity.job_id,
         identity.node_id, identity.worker_id, regime, growth.delta_bytes, growth.delta_s,
         profile.thermal_throttle_events, profile.bandwidth_jitter, profile.samples]
        for regime, growth in sorted(profile.regimes.items())
    ]


ALERT_COLUMNS = [
    "event_time", "event_id", "fingerprint", "status", "alertname", "policy_name",
    "policy_version", "job_id", "node_id", "worker_id", "pool", "gpu_uuid", "starts_at",
    "ends_at", "labels", "annotations",
]


def alert_rows(alert: AlertEvent) -> list[Row]:
    labels = alert.labels
    ends_at = ms_to_datetime(alert.ends_at_ms) if alert.ends_at_ms is not None else None
    return [[
        ms_to_datetime(alert.event_time_ms), alert.event_id, alert.fingerprint,
        alert.status.value, alert.alertname, alert.policy_name, alert.policy_version,
        labels.get("job", ""), labels.get("node", ""), labels.get("worker", ""),
        labels.get("pool", ""), labels.get("gpu_uuid", ""), ms_to_datetime(alert.starts_at_ms),
        ends_at, orjson.dumps(labels).decode(), orjson.dumps(alert.annotations).decode(),
    ]]


GPU_HEALTH_COLUMNS = [
    "event_time", "event_id", "gpu_uuid", "gpu_model", "state", "since", "signal", "reason",
    "policy_name", "job_id", "node_id", "worker_id",
]


def gpu_health_rows(record: GpuHealthEvent) -> list[Row]:
    identity = record.identity
    return [[
        ms_to_datetime(record.event_time_ms), record.event_id, record.gpu_uuid,
        record.gpu_model, record.state, ms_to_datetime(record.since_ms), record.signal,
        record.reason, record.policy_name, identity.job_id if identity else "",
        identity.node_id if identity else "", identity.worker_id if identity else "",
    ]]


USAGE_COLUMNS = [
    "event_time", "event_id", "service", "host", "pid", "started_at", "cpu_s", "rss_bytes",
]


def usage_rows(usage: ProcessUsage) -> list[Row]:
    return [[
        ms_to_datetime(usage.event_time_ms), usage.event_id, usage.service, usage.host,
        usage.pid, ms_to_datetime(usage.started_at_ms), usage.cpu_s, usage.rss_bytes,
    ]]


PERSONALITY_COLUMNS = [
    "event_time", "event_id", "scope", "gpu_uuid", "gpu_model", "node_id", "pool", "regime",
    "leak_bytes_per_s", "leak_observed_s", "bandwidth_jitter", "throttle_events", "ooms",
    "interruptions", "observed_s", "workers", "feature_events", "stability_score",
    "confidence", "first_seen", "last_seen",
]


def personality_rows(event: GpuPersonalityEvent) -> list[Row]:
    when = ms_to_datetime(event.event_time_ms)
    first, last = ms_to_datetime(event.first_seen_ms), ms_to_datetime(event.last_seen_ms)
    return [
        [when, event.event_id, event.scope, event.gpu_uuid, event.gpu_model, event.node_id,
         event.pool, regime, stats.leak_bytes_per_s, stats.leak_observed_s,
         stats.bandwidth_jitter, stats.throttle_events, stats.ooms, stats.interruptions,
         stats.observed_s, stats.workers, stats.feature_events,
         event.stability_score.get(regime, 0.0), event.confidence, first, last]
        for regime, stats in sorted(event.regimes.items())
    ]


AFFINITY_COLUMNS = [
    "event_time", "event_id", "workload", "gpu_model", "ooms", "interruptions", "stable_s",
    "observed_s", "first_seen", "last_seen",
]


def affinity_rows(event: WorkloadAffinityEvent) -> list[Row]:
    return [[
        ms_to_datetime(event.event_time_ms), event.event_id, event.workload, event.gpu_model,
        event.ooms, event.interruptions, event.stable_s, event.observed_s,
        ms_to_datetime(event.first_seen_ms), ms_to_datetime(event.last_seen_ms),
    ]]


TOPOLOGY_COLUMNS = [
    "event_time", "event_id", "node_id", "gpu_uuid", "gpu_model", "gpu_index", "numa_node",
    "cpu_affinity", "links", "nvlink_active",
]


def topology_rows(event: GpuTopologyEvent) -> list[Row]:
    return [[
        ms_to_datetime(event.event_time_ms), event.event_id, event.node_id, event.gpu_uuid,
        event.gpu_model, event.gpu_index, event.numa_node, list(event.cpu_affinity),
        dict(event.links), event.nvlink_active,
    ]]

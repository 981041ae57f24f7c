"""Events → ClickHouse rows: one pure function per table, no I/O."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    DeadLetter,
    FeatureEvent,
    GpuProfileEvent,
    PolicyDecision,
)

Row = list


def ms_to_datetime(epoch_ms: int) -> datetime:
    return datetime.fromtimestamp(epoch_ms / 1000.0, tz=UTC)


FEATURE_COLUMNS = [
    "event_time", "event_id", "job_id", "node_id", "worker_id", "gpu_uuid", "window",
    "feature", "value",
]


def feature_rows(event: FeatureEvent) -> list[Row]:
    identity = event.identity
    when = ms_to_datetime(event.event_time_ms)
    return [
        [when, event.event_id, identity.job_id, identity.node_id, identity.worker_id,
         event.gpu_uuid or "", event.window, name, value]
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
    "worker_id", "decision", "stage", "actuation_id", "detail",
]


def decision_rows(decision: PolicyDecision) -> list[Row]:
    identity = decision.identity
    return [[
        ms_to_datetime(decision.event_time_ms), decision.event_id, decision.policy_name,
        decision.policy_version, identity.job_id if identity else "",
        identity.node_id if identity else "", identity.worker_id if identity else "",
        decision.decision.value, decision.stage or 0, decision.actuation_id or "", decision.detail,
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

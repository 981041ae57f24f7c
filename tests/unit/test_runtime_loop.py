"""A platform runtime's loop without a broker: its reports become runtime features in the
metrics job, the built-in policy fires on a climbing call latency, and the webhook body
carries the signed command and its plain form."""

from __future__ import annotations

import orjson
import pytest

from dsec.actuators.webhooks import plain_action, webhook_body, webhook_command
from dsec.infra.records import Record
from dsec.policy_engine.builtin import load_builtin_policies
from dsec.schemas import (
    ActuationCommand,
    MetricBatch,
    RuntimeSample,
    WorkerIdentity,
    encode,
)
from dsec.schemas.actuations import GradAccumulationParams
from dsec.schemas.frames import batch_frames
from dsec.schemas.signing import HmacSigner, HmacVerifier
from dsec.schemas.topics import topic_names
from dsec.stream_jobs.metrics_job import MetricsJob
from dsec.stream_jobs.runtime_features import runtime_features

IDENTITY = WorkerIdentity(job_id="j", worker_id="dify-agent-7", node_id="external")
T0_MS = 1_800_000_000_000


def _report(at_ms: int, latency_ms: float, concurrency: int = 16) -> RuntimeSample:
    return RuntimeSample(event_time_ms=at_ms, runtime_type="dify", concurrency=concurrency,
                         mean_call_latency_ms=latency_ms, function_calling=True)


def test_the_latest_report_in_event_time_is_what_the_runtime_is_now() -> None:
    frames = batch_frames(MetricBatch(identity=IDENTITY, samples=[
        _report(T0_MS + 2_000, 1800.0, 24), _report(T0_MS, 400.0)]))
    assert runtime_features(frames["runtime"]) == {
        "runtime_call_latency_ms": 1800.0, "runtime_concurrency": 24.0,
        "runtime_call_latency_per_slot_ms": 75.0, "runtime_function_calling": 1.0}


def test_the_metrics_job_publishes_a_runtimes_features() -> None:
    topics = topic_names("t")
    batch = MetricBatch(identity=IDENTITY, samples=[_report(T0_MS, 2500.0)])
    job = MetricsJob(topics, {})
    result = job.process([Record(topics.metrics, 0, 0, b"dify-agent-7", encode(batch))],
                         T0_MS + 1_000)
    (event,) = result.features
    assert event.features["runtime_call_latency_ms"] == 2500.0
    assert event.identity == IDENTITY


def test_the_builtin_policy_asks_for_accumulation_over_the_latency_cap() -> None:
    (policy,) = [p for p in load_builtin_policies() if p.name == "runtime-latency-backoff"]
    assert policy.stages[0].actions == [GradAccumulationParams(steps=4)]
    assert policy.params["call_latency_cap_ms"] == 2000 and policy.for_s == 10


def test_the_webhook_body_holds_the_signed_command_and_the_plain_form() -> None:
    command = HmacSigner(b"key").sign(ActuationCommand(
        actuation_id="a" * 16, event_time_ms=T0_MS, expires_at_ms=T0_MS + 60_000,
        target=IDENTITY, policy_name="runtime-latency-backoff", policy_version=1,
        action=GradAccumulationParams(steps=4)))
    body = orjson.loads(webhook_body(command))
    assert body["action"] == plain_action(command) == {
        "policy": "grad_accumulation", "steps": 4, "target": "dify-agent-7",
        "policy_name": "runtime-latency-backoff", "actuation_id": "a" * 16,
        "expires_at_ms": T0_MS + 60_000}
    received = webhook_command(webhook_body(command))
    assert received == command
    HmacVerifier(b"key").verify(received)  # the signature holds as on the topic
    with pytest.raises(KeyError):
        webhook_command(encode(command))  # a bare command is not a webhook body

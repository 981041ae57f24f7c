"""The HTTP ingest gateway: auth, validation errors naming the field, publication on the real
broker, and webhook delivery of actuations."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import Consumer
from gateway_server import RecordingPublisher
from starlette.testclient import TestClient

from dsec.infra.keys import signer_for
from dsec.infra.runtime_registry import RuntimeRegistry
from dsec.ingest.gateway import IngestGateway
from dsec.ingest.gateway_config import GatewayConfig
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    MetricBatch,
    Signer,
    WorkerIdentity,
    decode,
    encode,
    now_ms,
    topic_names,
)
from dsec.schemas.actuations import SnapshotParams
from dsec.schemas.trust import KeyRole
from dsec.services.gateway import build_gateway

TOKEN = "s3cret-token"
LOOPBACK = {"webhook_allowed_networks": ("127.0.0.0/8",)}  # the test webhooks listen there
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REGISTRATION = {
    "runtime_id": "dify-agent-7", "runtime_type": "dify", "concurrency": 16,
    "mean_call_latency_ms": 840.0, "function_calling": True,
    "webhook_url": "http://127.0.0.1:9/dsec", "node_id": "agent-host-1",
}
GOOD_SAMPLES = {"samples": [
    {"kind": "episode", "event_time_ms": 1_800_000_000_000, "episode_index": 0,
     "reward": 3.5, "length": 12, "termination_reason": "tool_call_timeout"},
    {"kind": "heartbeat", "event_time_ms": 1_800_000_000_001, "interval_s": 5},
]}


@pytest.fixture
def gateway(tmp_path) -> tuple[TestClient, RecordingPublisher, RuntimeRegistry]:
    publisher = RecordingPublisher()
    registry = RuntimeRegistry(tmp_path / "runtimes.json")
    app = IngestGateway(GatewayConfig(token=TOKEN), registry, publisher, "job-a").app()
    return TestClient(app), publisher, registry












def _command(worker_id: str, signer: Signer, job_id: str = "job-a") -> ActuationCommand:
    now = now_ms()
    return signer.sign(ActuationCommand(
        actuation_id=uuid.uuid4().hex, event_time_ms=now, expires_at_ms=now + 60_000,
        target=WorkerIdentity(job_id=job_id, worker_id=worker_id, node_id="agent-host-1"),
        policy_name="reward-variance-jump", policy_version=1, action=SnapshotParams(),
    ))




@pytest.mark.integration
def test_gateway_publishes_to_the_metrics_topic_on_the_real_broker(settings) -> None:
    service = build_gateway(settings, GatewayConfig(token=TOKEN, **LOOPBACK), webhooks=False)
    try:
        client = TestClient(service.gateway.app())
        registered = client.post("/v1/runtimes", json=REGISTRATION, headers=AUTH)
        assert registered.status_code == 201
        own = {"Authorization": f"Bearer {registered.json()['token']}"}
        answer = client.post("/v1/runtimes/dify-agent-7/metrics", json=GOOD_SAMPLES,
                             headers=own)
        assert answer.status_code == 202, answer.text
        assert client.post("/v1/runtimes/dify-agent-7/metrics", json=GOOD_SAMPLES,
                           headers={"Authorization": "Bearer nope"}).status_code == 401
    finally:
        service.close()
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic_names(settings.topic_prefix).metrics])
    batches: list[MetricBatch] = []
    try:
        for _ in range(60):
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                batches.append(decode(message.value(), MetricBatch))
            if len(batches) == 2:
                break
    finally:
        consumer.close()
    assert [[s.kind for s in b.samples] for b in batches] == [["runtime"], ["episode", "heartbeat"]]
    assert {b.identity.worker_id for b in batches} == {"dify-agent-7"}


@pytest.mark.integration
def test_ingest_gateway_command_serves_and_refuses_a_bad_token(settings, tmp_path) -> None:
    import httpx

    from dsec.infra.kafka_local import free_port

    port = free_port()
    env = {**os.environ, "DSEC_GATEWAY_TOKEN": TOKEN, "DSEC_TOPIC_PREFIX": settings.topic_prefix,
           "DSEC_DATA_DIR": str(tmp_path / "dsec"),
           "DSEC_GATEWAY_WEBHOOK_ALLOWED_NETWORKS": '["127.0.0.0/8"]'}
    server = subprocess.Popen(
        [sys.executable, "-m", "dsec.cli", "ingest-gateway", "--port", str(port),
         "--bootstrap", settings.bootstrap],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stdout.read().decode()[-3000:]
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.3)
        refused = httpx.post(f"{base}/v1/runtimes", json=REGISTRATION,
                             headers={"Authorization": "Bearer nope"})
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
        accepted = httpx.post(f"{base}/v1/runtimes", json=REGISTRATION, headers=AUTH)
        assert accepted.status_code == 201, accepted.text
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.integration
def test_actuation_for_a_registered_runtime_reaches_its_webhook(settings) -> None:
    from confluent_kafka import Producer
    from webhook_server import RecordingWebhook

    webhook = RecordingWebhook(b'{"status": "applied", "detail": "snapshot taken by the agent"}')
    registration = {**REGISTRATION, "job_id": settings.job_id, "webhook_url": webhook.url}
    service = build_gateway(settings, GatewayConfig(token=TOKEN, **LOOPBACK)).start()
    topics = topic_names(settings.topic_prefix)
    producer = Producer({"bootstrap.servers": settings.bootstrap})
    key = signer_for(settings, KeyRole.COMMAND_SIGNER)
    try:
        client = TestClient(service.gateway.app())
        assert client.post("/v1/runtimes", json=registration, headers=AUTH).status_code == 201
        sent: list[str] = []
        deadline = time.monotonic() + 60
        while not webhook.bodies and time.monotonic() < deadline:  # until the consumer joined
            command = _command("dify-agent-7", key, job_id=settings.job_id)
            sent.append(command.actuation_id)
            producer.produce(topics.actuations, key=b"agent-host-1", value=encode(command))
            producer.flush(10)
            time.sleep(1.0)
        assert webhook.bodies, "no command reached the webhook"
        assert decode(webhook.bodies[0], ActuationCommand).actuation_id in sent
    finally:
        service.close()
        webhook.close()
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topics.actuation_results])
    results: list[ActuationResult] = []
    try:
        for _ in range(60):
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                results.append(decode(message.value(), ActuationResult))
            if results:
                break
    finally:
        consumer.close()
    assert results and results[0].status is ActuationStatus.APPLIED
    assert results[0].detail == "snapshot taken by the agent"

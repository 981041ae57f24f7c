"""A flood of forged commands on the real broker does not delay a genuine one past its
TTL (issue 24): not through the ingest gateway's webhook forwarder to a runtime's real
HTTP webhook, nor through the node actuator to a worker on its socket. The genuine
command is applied once, and a replay of it is not applied again."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from helpers import wait_for
from keys import FORGER
from starlette.testclient import TestClient
from webhook_server import RecordingWebhook

from dsec.actuators import ApplyHooks, NodeActuator, NodeActuatorConfig, WorkerChannel
from dsec.actuators.pipeline import DUPLICATE_DETAIL
from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.keys import signer_for, verifier_for
from dsec.infra.topics import ensure_topics
from dsec.ingest.gateway_config import GatewayConfig
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    Signer,
    WorkerIdentity,
    decode,
    encode,
    now_ms,
    topic_names,
)
from dsec.schemas.actuations import GradCompressionParams, SnapshotParams
from dsec.schemas.trust import KeyRole
from dsec.services.gateway import build_gateway

pytestmark = pytest.mark.integration

FORGED = 3000
TTL_MS = 10_000
TOKEN = "flood-token"


def _command(target: WorkerIdentity, signer: Signer, actuation_id: str | None = None,
             ttl_ms: int = TTL_MS, action=None) -> ActuationCommand:
    at = now_ms()
    return signer.sign(ActuationCommand(
        actuation_id=actuation_id or uuid.uuid4().hex, event_time_ms=at,
        expires_at_ms=at + ttl_ms, target=target, policy_name="flood-test", policy_version=1,
        action=action or SnapshotParams()))


def _flood(producer: Producer, topic: str, target: WorkerIdentity, real_id: str) -> None:
    """Forgeries (a key not trusted) for ``target`` on its node's key, a tenth of them carrying
    ``real_id``, and as many again keyed to other nodes."""
    for n in range(FORGED):
        if n % 2:
            forged = _command(target, FORGER, real_id if n % 10 == 1 else None)
            producer.produce(topic, key=target.node_id.encode(), value=encode(forged))
        else:
            other = target.model_copy(update={"node_id": f"elsewhere-{n % 5}"})
            producer.produce(topic, key=other.node_id.encode(),
                             value=encode(_command(other, FORGER)))
    assert producer.flush(30) == 0


class Results:
    def __init__(self, settings) -> None:
        self._consumer = Consumer(consumer_config(
            settings, group_id=f"test-results-{uuid.uuid4().hex[:6]}"))
        self._consumer.subscribe([topic_names(settings.topic_prefix).actuation_results])
        self.seen: list[ActuationResult] = []

    def of(self, actuation_id: str) -> list[tuple[str, str]]:
        while (message := self._consumer.poll(0.1)) is not None:
            if not message.error():
                self.seen.append(decode(message.value(), ActuationResult))
        return [(r.status.value, r.detail) for r in self.seen if r.actuation_id == actuation_id]

    def statuses(self, actuation_id: str) -> list[str]:
        return [status for status, _detail in self.of(actuation_id)]

    def close(self) -> None:
        self._consumer.close()


class Webhook(RecordingWebhook):
    def posts_of(self, actuation_id: str) -> list[int]:
        """When each command with ``actuation_id`` was posted (epoch ms)."""
        return [at_ms for at_ms, body in self.received
                if decode(body, ActuationCommand).actuation_id == actuation_id]


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook(b'{"status": "applied", "detail": "taken"}')
    try:
        yield hook
    finally:
        hook.close()


def test_a_genuine_webhook_command_outlasts_a_flood_of_forgeries(settings, webhook) -> None:
    settings = settings.model_copy(update={"job_id": f"flood-{uuid.uuid4().hex[:6]}"})
    topics = topic_names(settings.topic_prefix)
    service = build_gateway(settings, GatewayConfig(
        token=TOKEN, webhook_allowed_networks=("127.0.0.0/8",))).start()
    producer = Producer(producer_config(settings, client_id="test-flood"))
    key = signer_for(settings, KeyRole.COMMAND_SIGNER)
    results = Results(settings)
    runtime = WorkerIdentity(job_id=settings.job_id, worker_id="agent-flood",
                             node_id="agent-host-9")
    try:
        registered = TestClient(service.gateway.app()).post(
            "/v1/runtimes", headers={"Authorization": f"Bearer {TOKEN}"}, json={
                "runtime_id": runtime.worker_id, "runtime_type": "dify", "concurrency": 4,
                "mean_call_latency_ms": 100.0, "function_calling": True,
                "job_id": runtime.job_id, "node_id": runtime.node_id,
                "webhook_url": webhook.url})
        assert registered.status_code == 201, registered.text

        def warmed_up() -> bool:
            # A group member new to the topic starts at its end once it holds partitions.
            warm_up = _command(runtime, key, ttl_ms=60_000)
            producer.produce(topics.actuations, key=runtime.node_id.encode(),
                             value=encode(warm_up))
            producer.flush(10)
            return bool(wait_for_posts(webhook, warm_up.actuation_id, 2.0))

        wait_for(warmed_up, 90, interval_s=0, what="the forwarder to hold its partitions")
        genuine = _command(runtime, key)
        _flood(producer, topics.actuations, runtime, genuine.actuation_id)
        producer.produce(topics.actuations, key=runtime.node_id.encode(), value=encode(genuine))
        assert producer.flush(10) == 0
        posted_at = wait_for(lambda: webhook.posts_of(genuine.actuation_id), 30,
                             interval_s=0.05, what="the genuine command at the webhook")
        assert posted_at[0] < genuine.expires_at_ms, (
            f"posted {posted_at[0] - genuine.event_time_ms} ms after it was made")
        wait_for(lambda: "applied" in results.statuses(genuine.actuation_id), 30,
                 what="the genuine command's applied result")

        # A replay, then a fresh command behind it on the same partition: once the fresh
        # one is posted, the replay has been read.
        producer.produce(topics.actuations, key=runtime.node_id.encode(), value=encode(genuine))
        after = _command(runtime, key)
        producer.produce(topics.actuations, key=runtime.node_id.encode(), value=encode(after))
        assert producer.flush(10) == 0
        wait_for(lambda: webhook.posts_of(after.actuation_id), 30, what="the command after")
        assert len(webhook.posts_of(genuine.actuation_id)) == 1
        assert results.statuses(genuine.actuation_id).count("applied") == 1
    finally:
        results.close()
        service.close()


def wait_for_posts(webhook: Webhook, actuation_id: str, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if webhook.posts_of(actuation_id):
            return webhook.posts_of(actuation_id)
        time.sleep(0.05)
    return []


def test_a_genuine_node_command_outlasts_a_flood_of_forgeries(settings) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="dsec-flood-"))  # short: socket paths are limited
    ensure_topics(settings, partitions=2)
    topics = topic_names(settings.topic_prefix)
    producer = Producer(producer_config(settings, client_id="test-flood"))

    def publish(topic: str, key: bytes, value: bytes) -> None:
        producer.produce(topic, key=key, value=value)
        producer.poll(0)

    daemon = NodeActuator(
        NodeActuatorConfig(node_id="node-flood", run_dir=run_dir,
                           actuations_topic=topics.actuations,
                           results_topic=topics.actuation_results,
                           verifier=verifier_for(settings),
                           dead_letters_topic=topics.dead_letters),
        consumer_config(settings, group_id=f"{settings.topic_prefix}-node-flood"), publish,
    ).start()
    worker_identity = WorkerIdentity(job_id=settings.job_id, worker_id="w-flood",
                                     node_id="node-flood")
    applied: list[tuple[int, int]] = []
    hooks = ApplyHooks()
    hooks.register("grad_compression", lambda params: applied.append(
        (now_ms(), params.bits)) or f"{params.bits} bits")
    worker = WorkerChannel(worker_identity, daemon.socket_path, hooks).start()
    results = Results(settings)
    try:
        assert daemon.wait_ready(30)
        wait_for(lambda: worker.registered, 30, what="the worker registered")
        genuine = _command(worker_identity, signer_for(settings, KeyRole.COMMAND_SIGNER),
                           action=GradCompressionParams(bits=8))
        _flood(producer, topics.actuations, worker_identity, genuine.actuation_id)
        producer.produce(topics.actuations, key=b"node-flood", value=encode(genuine))
        assert producer.flush(10) == 0
        wait_for(lambda: worker.apply_pending() or applied, 30, interval_s=0.02,
                 what="the genuine command applied")
        assert applied[0][0] < genuine.expires_at_ms, (
            f"applied {applied[0][0] - genuine.event_time_ms} ms after it was made")

        producer.produce(topics.actuations, key=b"node-flood", value=encode(genuine))
        assert producer.flush(10) == 0
        wait_for(lambda: ("rejected", DUPLICATE_DETAIL) in results.of(genuine.actuation_id),
                 30, what="the replay refused")
        worker.apply_pending()
        assert applied == [(applied[0][0], 8)]
        statuses = results.statuses(genuine.actuation_id)
        assert statuses.count("applied") == 1
    finally:
        results.close()
        worker.stop()
        daemon.stop()
        producer.flush(10)
        shutil.rmtree(run_dir, ignore_errors=True)

"""Issue 24's forged and misdated commands through the node actuator on the real broker, to
a worker on its socket: a signed command dated a year ahead is refused, and a genuine
command's replay is refused even after more forgeries than the gate once remembered ids
(10,000), so none of them can push a verified id out. (A forgery carrying a genuine
command's id, and a flood delaying one past its TTL: test_command_flood_kafka.py.)"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from helpers import wait_for
from keys import FORGER

from dsec.actuators import ApplyHooks, NodeActuator, NodeActuatorConfig, WorkerChannel
from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.keys import signer_for, verifier_for
from dsec.infra.topics import ensure_topics
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
from dsec.schemas.actuations import GradCompressionParams
from dsec.schemas.trust import KeyRole

pytestmark = pytest.mark.integration
NODE = "node-poison"
FORGERIES = 10_001  # one more than the replay memory of unverified ids once held
YEAR_MS = 365 * 86_400_000


def _command(target: WorkerIdentity, key: Signer, bits: int = 8, at_ms: int | None = None,
             actuation_id: str | None = None) -> ActuationCommand:
    at = now_ms() if at_ms is None else at_ms
    return key.sign(ActuationCommand(
        actuation_id=actuation_id or uuid.uuid4().hex, event_time_ms=at,
        expires_at_ms=at + 600_000, target=target, policy_name="poison-test",
        policy_version=1, action=GradCompressionParams(bits=bits)))


def test_misdated_commands_and_replays_after_a_flood_are_refused(settings) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="dsec-poison-"))  # short: socket paths are limited
    ensure_topics(settings, partitions=2)
    topics = topic_names(settings.topic_prefix)
    producer = Producer(producer_config(settings, client_id="test-poison-commands"))

    def publish(topic: str, key: bytes, value: bytes) -> None:
        producer.produce(topic, key=key, value=value)
        producer.poll(0)

    daemon = NodeActuator(
        NodeActuatorConfig(node_id=NODE, run_dir=run_dir, actuations_topic=topics.actuations,
                           results_topic=topics.actuation_results,
                           verifier=verifier_for(settings),
                           dead_letters_topic=topics.dead_letters),
        consumer_config(settings, group_id=f"{settings.topic_prefix}-{NODE}"), publish,
    ).start()
    worker = WorkerIdentity(job_id=settings.job_id, worker_id="w-poison", node_id=NODE)
    applied: list[int] = []
    hooks = ApplyHooks()
    hooks.register("grad_compression", lambda params: applied.append(params.bits) or "ok")
    channel = WorkerChannel(worker, daemon.socket_path, hooks).start()
    results = Consumer(consumer_config(settings, group_id=f"results-{uuid.uuid4().hex[:6]}"))
    results.subscribe([topics.actuation_results])
    seen: list[ActuationResult] = []

    def statuses(actuation_id: str) -> list[tuple[str, str]]:
        while (message := results.poll(0.1)) is not None:
            if not message.error():
                seen.append(decode(message.value(), ActuationResult))
        return [(r.status.value, r.detail) for r in seen if r.actuation_id == actuation_id]

    def send(*commands: ActuationCommand) -> None:
        for command in commands:
            producer.produce(topics.actuations, key=NODE.encode(), value=encode(command))
        assert producer.flush(60) == 0

    key = signer_for(settings, KeyRole.COMMAND_SIGNER)
    try:
        assert daemon.wait_ready(30)
        wait_for(lambda: channel.registered, 30, what="the worker registered")
        ahead = _command(worker, key, bits=4, at_ms=now_ms() + YEAR_MS)
        genuine = _command(worker, key, bits=8)
        send(ahead, genuine)
        wait_for(lambda: channel.apply_pending() or applied, 60, interval_s=0.05,
                 what="the genuine command applied")
        refused = wait_for(lambda: statuses(ahead.actuation_id), 60, what="the misdated one")
        assert refused[0][0] == "rejected" and "ahead of this clock" in refused[0][1]

        forged = encode(_command(worker, FORGER, actuation_id="f" * 32))
        for n in range(FORGERIES):  # each with an id of its own
            producer.produce(topics.actuations, key=NODE.encode(),
                             value=forged.replace(b"f" * 32, f"{n:032x}".encode()))
        send(genuine)
        replay = wait_for(lambda: [s for s in statuses(genuine.actuation_id)
                                   if s[0] != "applied"], 180, interval_s=0.5,
                          what="the replay after the forgeries answered")
        assert replay[0][0] == "rejected" and "duplicate" in replay[0][1], replay
        channel.apply_pending()
        assert applied == [8]
        assert [s for s, _ in statuses(genuine.actuation_id)].count("applied") == 1
    finally:
        results.close()
        channel.stop()
        daemon.stop()
        producer.flush(10)
        shutil.rmtree(run_dir, ignore_errors=True)

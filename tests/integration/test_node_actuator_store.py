"""Node actuator results reach ClickHouse through the running stack's sink."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from confluent_kafka import Producer
from helpers import wait_for

from dsec.actuators import ApplyHooks, NodeActuator, NodeActuatorConfig, WorkerChannel
from dsec.actuators.worker_controls import WorkerControls
from dsec.history import query
from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.keys import signer_for, verifier_for
from dsec.schemas import (
    ActuationCommand,
    WorkerIdentity,
    encode,
    new_event_id,
    now_ms,
    topic_names,
)
from dsec.schemas.actuations import GradCompressionParams, SamplerParams
from dsec.schemas.trust import KeyRole

pytestmark = pytest.mark.integration


def test_applied_and_rejected_results_are_stored(running_stack) -> None:
    settings = running_stack
    topics = topic_names(settings.topic_prefix)
    producer = Producer(producer_config(settings, client_id="test-store"))

    def publish(topic: str, key: bytes, value: bytes) -> None:
        producer.produce(topic, key=key, value=value)
        producer.flush(10)

    run_dir = Path(tempfile.mkdtemp(prefix="dsec-store-"))
    daemon = NodeActuator(
        NodeActuatorConfig(node_id="node-s", run_dir=run_dir,
                           actuations_topic=topics.actuations,
                           results_topic=topics.actuation_results,
                           verifier=verifier_for(settings)),
        consumer_config(settings, group_id="dsec-node-node-s"), publish,
    ).start()
    identity = WorkerIdentity(job_id=settings.job_id, worker_id="w-store", node_id="node-s")
    controls, hooks = WorkerControls(), ApplyHooks()
    controls.register(hooks)
    worker = WorkerChannel(identity, daemon.socket_path, hooks).start()
    try:
        at = now_ms()
        good = signer_for(settings, KeyRole.COMMAND_SIGNER).sign(ActuationCommand(
            actuation_id=new_event_id(), event_time_ms=at, expires_at_ms=at + 60_000,
            target=identity, policy_name="test", policy_version=1,
            action=GradCompressionParams(bits=4)))
        unsigned = good.model_copy(update={"actuation_id": new_event_id(), "signature": None,
                                           "action": SamplerParams(paused=True)})
        for command in (good, unsigned):
            producer.produce(topics.actuations, key=b"node-s", value=encode(command))
        producer.flush(10)

        def stored() -> list:
            worker.apply_pending()
            rows = query(settings, "SELECT action, status FROM actuation_results "
                                   "WHERE worker_id = 'w-store' ORDER BY action")["rows"]
            return rows if len(rows) >= 2 else []

        rows = wait_for(stored, 90, what="both results in ClickHouse")
        assert rows == [["grad_compression", "applied"], ["sampler", "rejected"]]
        assert controls.grad_compression.bits == 4
    finally:
        worker.stop()
        daemon.stop()
        shutil.rmtree(run_dir, ignore_errors=True)

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
from dsec.schemas.actuations import GradCompressionParams, PrecisionParams, SamplerParams
from dsec.schemas.trust import KeyRole

pytestmark = pytest.mark.integration


def test_applied_unsupported_and_rejected_results_are_stored(running_stack) -> None:
    """With what was requested beside what is in force, as ``dsec sql`` shows them."""
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

    def forward() -> None:  # the worker's loop runs under the autocast controller
        with controls.precision():
            pass

    forward()
    try:
        at = now_ms()

        def command(action) -> ActuationCommand:
            return signer_for(settings, KeyRole.COMMAND_SIGNER).sign(ActuationCommand(
                actuation_id=new_event_id(), event_time_ms=at, expires_at_ms=at + 60_000,
                target=identity, policy_name="test", policy_version=1, action=action))

        applied = command(PrecisionParams(dtype="bf16"))
        unsupported = command(GradCompressionParams(bits=4))  # no comm hook in this worker
        unsigned = command(SamplerParams(paused=True)).model_copy(update={"signature": None})
        for sent in (applied, unsupported, unsigned):
            producer.produce(topics.actuations, key=b"node-s", value=encode(sent))
        producer.flush(10)

        def stored() -> list:
            worker.apply_pending()
            forward()
            rows = query(settings, "SELECT action, status, requested, in_force "
                                   "FROM actuation_results "
                                   "WHERE worker_id = 'w-store' ORDER BY action")["rows"]
            return rows if len(rows) >= 3 else []

        rows = wait_for(stored, 90, what="the three results in ClickHouse")
        assert rows == [["grad_compression", "unsupported", "4", None],
                        ["precision", "applied", "bf16", "bf16"],
                        ["sampler", "rejected", None, None]]
        assert controls.grad_compression.bits == 4  # requested, for a hook attached later
    finally:
        worker.stop()
        daemon.stop()
        shutil.rmtree(run_dir, ignore_errors=True)

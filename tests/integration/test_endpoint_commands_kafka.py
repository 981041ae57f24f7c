"""A worker in endpoint mode gets its commands back through the ingest gateway, on the real
broker: a signed command on the actuation topic reaches the gateway's forwarder, waits in
its mailbox for the worker's poll, is applied at the worker's next step boundary and its
result, posted back through the gateway, is on the results topic under the worker's
registered identity."""

from __future__ import annotations

import time
import uuid

import pytest
import torch
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from gateway_server import serve
from helpers import wait_for

import dsec
from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.keys import signer_for
from dsec.ingest import ProbeConfig
from dsec.ingest.gateway_config import GatewayConfig
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    decode,
    encode,
    new_event_id,
    now_ms,
    topic_names,
)
from dsec.schemas.actuations import SnapshotParams
from dsec.schemas.trust import KeyRole
from dsec.services.gateway import build_gateway

pytestmark = pytest.mark.integration
TOKEN = "endpoint-commands-token"


def _results(settings) -> Consumer:
    consumer = Consumer(consumer_config(settings, group_id=f"test-{uuid.uuid4().hex[:6]}"))
    topic = topic_names(settings.topic_prefix).actuation_results
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    return consumer


def test_a_worker_in_endpoint_mode_fetches_its_command_and_reports_it_through_the_gateway(
        settings, tmp_path) -> None:
    signer = signer_for(settings, KeyRole.COMMAND_SIGNER)  # the local keys and trust list
    topics = topic_names(settings.topic_prefix)
    config = GatewayConfig(token=TOKEN)
    service = build_gateway(settings, config).start()
    producer = Producer(producer_config(settings, client_id="test-endpoint-commands"))
    seen: list[ActuationResult] = []
    results = None
    try:
        with serve(service.gateway, config) as gateway:
            runtime = dsec.init(
                worker_id=f"ep-{uuid.uuid4().hex[:6]}", node_id="node-ep", settings=settings,
                endpoint=gateway.url, endpoint_token=TOKEN,
                probe_config=ProbeConfig(flush_interval_s=0.05, grad_sync_timing=False,
                                         cuda_memory_interval_s=0, gpu_sample_interval_s=0))
            assert runtime.actuator is not None and runtime.actuator.polls
            model = torch.nn.Linear(4, 2)
            runtime.enable_snapshots(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                     directory=str(tmp_path / "snapshots"))
            assert service.forwarder is not None and service.forwarder.wait_ready(60)
            wait_for(lambda: service.registry.get(runtime.identity.worker_id), 30,
                     what="the worker registered")
            results = _results(settings)
            command = signer.sign(ActuationCommand(
                actuation_id=new_event_id(), expires_at_ms=now_ms() + 120_000,
                target=runtime.identity, policy_name="endpoint-test", policy_version=1,
                action=SnapshotParams()))
            sent_s = time.monotonic()
            producer.produce(topics.actuations, key=b"node-ep", value=encode(command))
            producer.flush(10)

            def reported() -> ActuationResult | None:
                dsec.report_step(0.5)  # the training loop: a step boundary
                while (message := results.poll(0.05)) is not None:
                    if not message.error():
                        seen.append(decode(message.value(), ActuationResult))
                return next((r for r in seen if r.actuation_id == command.actuation_id), None)

            result = wait_for(reported, 60, interval_s=0.05, what="the worker's result")
            round_trip_s = time.monotonic() - sent_s
            dsec.shutdown()
    finally:
        dsec.shutdown()
        service.close()
        producer.flush(10)
        if results is not None:
            results.close()

    assert result.status is ActuationStatus.APPLIED and result.action_kind == "snapshot"
    assert result.detail.startswith("snapshot 0 started at step")
    assert result.identity == runtime.identity  # as registered with the gateway
    assert [r.actuation_id for r in seen].count(command.actuation_id) == 1  # nothing else
    assert any((tmp_path / "snapshots").rglob("*"))
    print(f"command on the topic to its applied result on the topic: {round_trip_s:.2f} s")

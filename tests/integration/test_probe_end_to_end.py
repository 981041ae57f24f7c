"""Worker probes on real parts: a two-rank gloo DDP job on CartPole publishes every signal to
the real broker, and a broker outage loses nothing within the buffer bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError

from dsec.infra.kafka_local import free_port
from dsec.infra.topics import ensure_topics
from dsec.schemas import MetricBatch, decode, topic_names

pytestmark = pytest.mark.integration
WORKER = Path(__file__).parents[1] / "probe_worker.py"


def consume_batches(bootstrap: str, topic: str, enough, timeout_s: float) -> list[MetricBatch]:
    """Every message on ``topic``, each validated as a ``MetricBatch``, until ``enough``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    batches: list[MetricBatch] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not enough(batches):
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                continue
            batches.append(decode(message.value(), MetricBatch))
    finally:
        consumer.close()
    return batches


def test_two_rank_gloo_cartpole_job_publishes_every_signal(settings, tmp_path) -> None:
    ensure_topics(settings)
    env = {
        **os.environ,
        "DSEC_BOOTSTRAP": settings.bootstrap,
        "DSEC_TOPIC_PREFIX": settings.topic_prefix,
        "DSEC_JOB_ID": settings.job_id,
        "DSEC_DATA_DIR": str(tmp_path / "dsec"),
    }
    port = free_port()
    workers = [
        subprocess.Popen([sys.executable, str(WORKER), "--rank", str(rank), "--port", str(port)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    counters = {}
    for rank, worker in enumerate(workers):
        out, err = worker.communicate(timeout=240)
        assert worker.returncode == 0, err[-4000:]
        counters[f"rank{rank}"] = json.loads(out.strip().splitlines()[-1])
    for worker_counters in counters.values():
        assert worker_counters["samples_dropped"] == 0
        assert worker_counters["samples_sent"] == worker_counters["samples_recorded"]

    def received(batches: list[MetricBatch]) -> Counter:
        return Counter(b.identity.worker_id for b in batches for _ in b.rows())

    expected = Counter({worker_id: c["samples_sent"] for worker_id, c in counters.items()})
    batches = consume_batches(settings.bootstrap, topic_names(settings.topic_prefix).metrics,
                              lambda got: received(got) == expected, 60)
    assert received(batches) == expected  # every sample sent arrived, once

    for worker_id in counters:
        samples = [s for b in batches if b.identity.worker_id == worker_id for s in b.rows()]
        by_kind: dict[str, list] = {}
        for sample in samples:
            by_kind.setdefault(sample.kind, []).append(sample)
        assert {"step", "episode", "grad_sync", "gpu", "heartbeat"} <= set(by_kind), by_kind.keys()

        steps = by_kind["step"]
        assert len(steps) == 6
        assert {s.grad_norm_source for s in steps} == {"probe", "trainer"}
        assert all(s.grad_norm > 0 for s in steps)
        assert [s.loss_nonfinite for s in steps].count(True) == 1
        assert all(s.loss is not None for s in steps if not s.loss_nonfinite)

        episodes = by_kind["episode"]
        assert len(episodes) == 6 and all(e.length > 0 and e.reward == e.length for e in episodes)
        assert {e.termination_reason for e in episodes} <= {"pole_fell", "cart_out_of_bounds"}

        syncs = by_kind["grad_sync"]
        ops = Counter(s.op for s in syncs)
        assert ops["all_reduce"] == 6 and ops["ddp_bucket_all_reduce"] >= 6
        assert all(s.ok and s.bytes > 0 and s.latency_ms >= 0 for s in syncs)
        assert all(s.timer == "wall_clock" for s in syncs)  # CPU / gloo
        bucket_bytes = {s.bytes for s in syncs if s.op == "ddp_bucket_all_reduce"}
        assert sum(bucket_bytes) >= (4 * 32 + 32 + 32 * 2 + 2) * 4

        gpus = by_kind["gpu"]
        assert {g.gpu_uuid for g in gpus} == {"GPU-00000000-aaaa-bbbb", "GPU-00000001-aaaa-bbbb"}

        last_heartbeat = max(by_kind["heartbeat"], key=lambda h: h.event_time_ms)
        assert last_heartbeat.samples_dropped == 0
        assert last_heartbeat.samples_recorded == counters[worker_id]["samples_recorded"]


def test_broker_outage_loses_nothing_within_the_bound_and_counts_the_rest(tmp_path) -> None:
    """A broker of this test's own is killed for 10 s and restarted on the same port."""
    from dsec.infra.kafka_local import LocalKafka

    broker = LocalKafka(data_dir=tmp_path / "kafka")
    broker.start()
    try:
        _outage(broker, tmp_path)
    finally:
        broker.stop()


def _outage(broker, tmp_path) -> None:
    from dsec.ingest import ProbeConfig
    from dsec.runtime import WorkerRuntime
    from dsec.schemas import WorkerIdentity
    from dsec.schemas.settings import DsecSettings

    bound, per_message, queued_messages = 3_000, 500, 2
    settings = DsecSettings(bootstrap=broker.bootstrap, topic_prefix="outage",
                            data_dir=tmp_path / "dsec")
    ensure_topics(settings, partitions=1)
    config = ProbeConfig(
        flush_interval_s=0.1, heartbeat_interval_s=1.0, buffer_max_samples=bound,
        max_samples_per_message=per_message, transport_queue_max_messages=queued_messages,
        message_timeout_s=120, grad_sync_timing=False, cuda_memory_interval_s=0,
        gpu_sample_interval_s=0,
    )
    identity = WorkerIdentity(job_id="outage", worker_id="w0", node_id="n0")
    runtime = WorkerRuntime(settings, identity, config, actuate=False).start()
    probe = runtime.probe
    try:
        for index in range(100):
            probe.record_episode(1.0, index + 1)
        deadline = time.monotonic() + 30
        while probe.counters().samples_buffered and time.monotonic() < deadline:
            time.sleep(0.1)
        assert probe.counters().samples_buffered == 0 and probe.counters().samples_sent >= 100

        broker.kill()
        outage_start = time.monotonic()
        within = 1_000  # well inside the bound: none may be lost
        for index in range(within):
            probe.record_episode(1.0, 1)
            if index % 100 == 99:
                time.sleep(0.3)
        assert probe.counters().samples_dropped == 0
        beyond = 6_000  # more than the buffer and the client's queue can hold together
        for _ in range(beyond):
            probe.record_episode(2.0, 1)
        dropped_in_outage = probe.counters().samples_dropped
        assert dropped_in_outage > 0
        time.sleep(max(0.0, 10.0 - (time.monotonic() - outage_start)))
        broker.start()

        deadline = time.monotonic() + 90
        while probe.counters().samples_buffered and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        counters = runtime.shutdown()

    def done(got: list[MetricBatch]) -> bool:
        return sum(len(b.samples) for b in got) >= counters.samples_sent

    batches = consume_batches(broker.bootstrap, topic_names("outage").metrics, done, 60)
    samples = [s for b in batches for s in b.rows()]
    assert len({s.event_id for s in samples}) == len(samples)  # idempotent: no duplicates
    assert counters.samples_buffered == 0
    assert len(samples) == counters.samples_sent
    assert counters.samples_sent + counters.samples_dropped == counters.samples_recorded
    episodes = [s for s in samples if s.kind == "episode"]
    assert sum(1 for e in episodes if e.reward == 1.0) == 100 + within  # none lost
    # heartbeats meet the same bound: what is not an arrived heartbeat was an episode
    heartbeats_recorded = counters.samples_recorded - (100 + within + beyond)
    heartbeats_dropped = heartbeats_recorded - sum(1 for s in samples if s.kind == "heartbeat")
    episodes_dropped = counters.samples_dropped - heartbeats_dropped
    assert sum(1 for e in episodes if e.reward == 2.0) == beyond - episodes_dropped
    assert counters.messages_failed == 0  # what Kafka's client took was all delivered
    assert episodes_dropped <= dropped_in_outage  # no episode lost once recording stopped
    # the bound: the buffer plus what the client's queue had taken before it filled up
    assert beyond - episodes_dropped <= bound + per_message * queued_messages
    final_heartbeat = max((s for s in samples if s.kind == "heartbeat"),
                          key=lambda h: h.event_time_ms)
    assert final_heartbeat.samples_dropped == counters.samples_dropped

"""The walking skeleton on real parts: a torch loop with the probe → Kafka → Faust → ClickHouse
→ policy engine → actuator inside the worker → result row in ClickHouse."""

from __future__ import annotations

import time
import uuid

import pytest
import torch
from confluent_kafka import Consumer, Producer, TopicPartition
from helpers import wait_for

import dsec
from dsec.history import query
from dsec.ingest import ProbeConfig
from dsec.schemas import (
    DeadLetter,
    EpisodeSample,
    MetricBatch,
    WorkerIdentity,
    decode,
    encode,
    now_ms,
    topic_names,
)

pytestmark = pytest.mark.integration


def _rows(settings, sql: str) -> list:
    return query(settings, sql)["rows"]


def test_variance_jump_snapshots_the_worker_and_the_result_is_stored(running_stack) -> None:
    settings = running_stack
    worker_id = f"w-{uuid.uuid4().hex[:6]}"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    runtime = dsec.init(worker_id=worker_id, node_id="node-a", optimizer=optimizer,
                        settings=settings, probe_config=ProbeConfig(
                            heartbeat_interval_s=1.0, step_sample_every_n_steps=1,
                            grad_norm_every_n_steps=1))
    snapshots: list[int] = []  # episodes reported when each snapshot was taken
    episodes = 0

    @dsec.on_action("snapshot")
    def snapshot(_params) -> str:
        snapshots.append(episodes)
        return f"snapshot at step {runtime.probe.global_step}"

    calm = [10.0 + 0.1 * (i % 2) for i in range(20)]
    wild = [0.0 if i % 2 else 50.0 for i in range(20)]
    rewards = iter(calm + wild)
    try:
        deadline = time.monotonic() + 90
        # Other policies (the periodic snapshot) may snapshot earlier: wait for one taken
        # after the jump began (the time-window variance sees it within 10 episodes),
        # with every episode reported.
        while not (episodes == 40 and any(n > 20 for n in snapshots)) \
                and time.monotonic() < deadline:
            x = torch.randn(64, 8)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            dsec.report_step(loss)
            optimizer.step()
            reward = next(rewards, None)
            if reward is not None:
                dsec.report_episode_end(reward, 100)
                episodes += 1
            time.sleep(0.01)
    finally:
        counters = dsec.shutdown()
    assert any(n > 20 for n in snapshots), "no snapshot after the variance jump within 90 s"
    assert counters is not None and counters.samples_dropped == 0

    applied = wait_for(lambda: _rows(
        settings,
        f"SELECT status, action FROM actuation_results WHERE worker_id = '{worker_id}'",
    ), 60, what="the actuation result in ClickHouse")
    assert ["applied", "snapshot"] in applied
    actuations = wait_for(lambda: _rows(
        settings, "SELECT policy_name, node_id FROM actuations "
                  f"WHERE worker_id = '{worker_id}' AND policy_name = 'reward-variance-jump'",
    ), 30, what="the actuation row")  # another topic: it may land after the result
    assert actuations == [["reward-variance-jump", "node-a"]]
    def stored_kinds() -> dict | None:  # the sink may still be writing the last batches
        kinds = dict(_rows(settings, "SELECT kind, count() FROM raw_metrics "
                                     f"WHERE worker_id = '{worker_id}' GROUP BY kind"))
        return kinds if kinds.get("episode", 0) >= 40 else None

    kinds = wait_for(stored_kinds, 60, what="every episode in raw metrics")
    assert kinds["episode"] == 40 and kinds["step"] >= 40 and kinds["heartbeat"] >= 1
    grad_norms = _rows(settings, "SELECT count() FROM raw_metrics WHERE worker_id = "
                                 f"'{worker_id}' AND kind = 'step' AND values['grad_norm'] > 0")
    assert grad_norms[0][0] >= 40
    def jump() -> float | None:  # the features topic's rows may land after the others
        ratio = _rows(settings, "SELECT max(value) FROM features WHERE feature = "
                                f"'reward_variance_jump_ratio' AND worker_id = '{worker_id}'")
        return ratio[0][0] if ratio and ratio[0][0] and ratio[0][0] > 4.0 else None

    assert wait_for(jump, 60, what="the variance jump in the stored features") > 4.0


def test_malformed_event_is_dead_lettered_and_the_pipeline_goes_on(running_stack) -> None:
    settings = running_stack
    topics = topic_names(settings.topic_prefix)
    producer = Producer({"bootstrap.servers": settings.bootstrap, "enable.idempotence": True,
                         "acks": "all"})
    bad_payload = b'{"identity": {"job_id": "j"}, "samples": "nope"}'
    producer.produce(topics.metrics, key=b"bad-worker", value=bad_payload)
    worker_id = f"after-{uuid.uuid4().hex[:6]}"
    good = MetricBatch(
        identity=WorkerIdentity(job_id="test-job", worker_id=worker_id, node_id="node-b"),
        samples=[EpisodeSample(event_time_ms=now_ms(), episode_index=0, reward=1.0, length=5)],
    )
    producer.produce(topics.metrics, key=worker_id.encode(), value=encode(good))
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topics.dead_letters, 0, 0)])
    letters: list[DeadLetter] = []

    def found_bad() -> bool:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            letters.append(decode(message.value(), DeadLetter))
        return any(letter.payload == bad_payload.decode() for letter in letters)

    try:
        wait_for(found_bad, 60, interval_s=0, what="the dead letter")
    finally:
        consumer.close()
    letter = next(letter for letter in letters if letter.payload == bad_payload.decode())
    assert letter.source_topic == topics.metrics
    assert "invalid MetricBatch" in letter.reason and "samples" in letter.reason

    stored = wait_for(lambda: _rows(
        settings, f"SELECT count() FROM raw_metrics WHERE worker_id = '{worker_id}'"
    )[0][0], 60, what="the good batch after the bad one")
    assert stored == 1
    in_store = wait_for(lambda: _rows(
        settings, "SELECT reason FROM dead_letters WHERE payload LIKE '%nope%'"), 60,
        what="the dead letter row")
    assert "samples" in in_store[0][0]

"""Helpers for the policy engine's real-broker tests: the engine as its own process
(``dsec policy serve``), feature traces in, commands and audit records read back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from helpers import wait_for

from dsec.infra.keys import signing_env
from dsec.schemas import (
    ActuationCommand,
    FeatureEvent,
    PolicyDecision,
    WorkerIdentity,
    decode,
    encode,
    topic_names,
)
from dsec.schemas.feature_columns import feature_events
from dsec.schemas.settings import DsecSettings


def env_for(settings: DsecSettings) -> dict[str, str]:
    return {
        **os.environ,
        "DSEC_BOOTSTRAP": settings.bootstrap,
        "DSEC_TOPIC_PREFIX": settings.topic_prefix,
        "DSEC_DATA_DIR": str(settings.data_dir),
        **signing_env(settings),
    }


class EngineProcess:
    """``dsec policy serve`` in its own process; stopped with SIGINT, like an operator."""

    def __init__(self, settings: DsecSettings, log_path: Path) -> None:
        self.settings = settings
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> EngineProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "dsec.cli", "policy", "serve"],
                env=env_for(self.settings), stdout=log, stderr=subprocess.STDOUT,
            )
        return self

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Reader:
    """Everything on one topic since the beginning, decoded, polled on demand (for
    ``FeatureEvent``, every event of a message of columns)."""

    def __init__(self, settings: DsecSettings, topic: str, model) -> None:
        self.model = model
        self.items: list = []
        self.consumer = Consumer({"bootstrap.servers": settings.bootstrap,
                                  "group.id": uuid.uuid4().hex, "enable.auto.commit": False,
                                  "auto.offset.reset": "earliest"})
        metadata = self.consumer.list_topics(topic, timeout=30).topics[topic]
        self.consumer.assign([TopicPartition(topic, p, 0) for p in metadata.partitions])

    def drain(self, seconds: float = 0.5) -> list:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            message = self.consumer.poll(0.2)
            if message is None or message.error():
                continue
            if self.model is None:
                self.items.append((message.key(), message.value()))
            elif self.model is FeatureEvent:  # single events and columns alike
                self.items.extend(feature_events(message.value()))
            else:
                self.items.append(decode(message.value(), self.model))
        return self.items

    def wait(self, predicate, timeout_s: float, what: str):
        """The predicate's answer, or everything read when that answer is just ``True``."""
        value = wait_for(lambda: predicate(self.drain()), timeout_s, interval_s=0, what=what)
        return self.items if value is True else value

    def close(self) -> None:
        self.consumer.close()


class Rig:
    def __init__(self, settings: DsecSettings) -> None:
        self.settings = settings
        topics = topic_names(settings.topic_prefix)
        self.topics = topics
        self.producer = Producer({"bootstrap.servers": settings.bootstrap,
                                  "enable.idempotence": True, "acks": "all"})
        self.commands = Reader(settings, topics.actuations, ActuationCommand)
        self.decisions = Reader(settings, topics.decisions, PolicyDecision)
        self.policies = Reader(settings, topics.policies, None)

    def send(self, events: list[FeatureEvent]) -> None:
        for event in events:
            self.producer.produce(self.topics.features, key=event.identity.worker_id.encode(),
                                  value=encode(event))
        assert self.producer.flush(30) == 0

    def raw_policy(self, key: bytes, value: bytes | None) -> None:
        self.producer.produce(self.topics.policies, key=key, value=value)
        assert self.producer.flush(30) == 0

    def close(self) -> None:
        for reader in (self.commands, self.decisions, self.policies):
            reader.close()


def trace(features: dict, seconds: int, worker: str, start_ms: int, step_s: int = 5,
          tags: dict | None = None) -> list[FeatureEvent]:
    identity = WorkerIdentity(job_id="job", worker_id=worker, node_id=f"node-{worker}")
    return [FeatureEvent(identity=identity, event_time_ms=start_ms + t * 1000,
                         features=features, tags=tags or {"episode_end_reason": "wall"},
                         gpu_uuid="GPU-1")
            for t in range(0, seconds, step_s)]

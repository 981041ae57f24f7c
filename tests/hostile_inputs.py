"""Issue 24's poison messages, and a well-behaved worker's, for the real-broker tests; and a
``dsec up`` stack serving its health endpoints."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from confluent_kafka import Producer
from helpers import start_stack, stop_stack, wait_for

from dsec.history import query
from dsec.infra.kafka_local import free_port
from dsec.schemas import EpisodeSample, MetricBatch, WorkerIdentity, encode, now_ms
from dsec.schemas.settings import DsecSettings
from dsec.services.stack import read_stack_state

DAY_MS = 86_400_000


def identity(worker: str) -> dict[str, str]:
    return {"job_id": "test-job", "worker_id": worker, "node_id": "node-h"}


def episodes(worker: str, index: int, count: int = 3, start_ms: int | None = None) -> bytes:
    """A well-formed batch of ``count`` episodes (episode numbers from ``index * count``)."""
    at = now_ms() - 60_000 if start_ms is None else start_ms
    first = index * count
    return encode(MetricBatch(
        identity=WorkerIdentity(**identity(worker)),
        samples=[EpisodeSample(event_time_ms=at + first + i, episode_index=first + i,
                               reward=float((first + i) % 7), length=10)
                 for i in range(count)]))


def _columns(worker: str, columns: dict) -> bytes:
    # json, not orjson: it writes any value given, as a hostile client would
    return json.dumps({"identity": identity(worker), "columns": {"episode": columns}}).encode()


def nested_lists(worker: str, ragged: bool) -> bytes:
    """Rewards as nested lists, ``[[1, 2], [3]]`` or ``[[1, 2], [3, 4]]``."""
    at = now_ms()
    return _columns(worker, {"event_time_ms": [at, at + 1], "episode_index": [0, 1],
                             "length": [5, 5], "reward": [[1, 2], [3]] if ragged
                             else [[1, 2], [3, 4]]})


def huge_rewards(worker: str) -> bytes:
    """Finite rewards whose variance overflows (1e308 and -1e308)."""
    at = now_ms()
    return _columns(worker, {"event_time_ms": [at, at + 1], "episode_index": [0, 1],
                             "length": [5, 5], "reward": [1e308, -1e308]})


def infinite_packed_reward(worker: str) -> bytes:
    at = now_ms()
    reward = np.array([1.0, np.inf], dtype="<f8")
    return _columns(worker, {"event_time_ms": [at, at + 1], "episode_index": [0, 1],
                             "length": [5, 5], "reward": {
                                 "dtype": "<f8",
                                 "data": base64.b64encode(reward.tobytes()).decode()}})


def dated(worker: str, time_ms: int, rows: bool) -> bytes:
    """One episode at ``time_ms`` (0: 1970), as a row or as columns."""
    if rows:
        return json.dumps({"identity": identity(worker), "samples": [
            {"kind": "episode", "event_time_ms": time_ms, "episode_index": 0, "reward": 1.0,
             "length": 5}]}).encode()
    return _columns(worker, {"event_time_ms": [time_ms], "episode_index": [0],
                             "reward": [1.0], "length": [5]})


def publish(settings: DsecSettings, topic: str, messages: list[tuple[bytes, bytes | None]]
            ) -> None:
    """``(key, value)`` pairs in order, each durable on the broker."""
    producer = Producer({"bootstrap.servers": settings.bootstrap, "enable.idempotence": True,
                         "acks": "all"})
    for key, value in messages:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(60) == 0


def rows(settings: DsecSettings, sql: str) -> list:
    return query(settings, sql)["rows"]


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


@dataclass
class RunningStack:
    settings: DsecSettings
    process: object
    urls: dict[str, str]  # service -> base URL of its /healthz and /metrics

    def health(self) -> dict[str, int]:
        return {service: httpx.get(f"{url}/healthz", timeout=5).status_code
                for service, url in self.urls.items()}

    def stop(self) -> None:
        stop_stack(self.process)


def start_serving_stack(bootstrap: str, data_dir: Path, topic_prefix: str | None = None,
                        env: dict[str, str] | None = None) -> RunningStack:
    """``dsec up`` with its metrics ports, once every service answers ``/healthz`` 200."""
    prefix = topic_prefix or f"t{uuid.uuid4().hex[:10]}"
    port = free_port(consecutive=2)  # the stack, and its sink child on the next port
    settings = DsecSettings(bootstrap=bootstrap, topic_prefix=prefix, job_id="test-job",
                            data_dir=data_dir)
    process = start_stack(bootstrap, data_dir, prefix,
                          env={"DSEC_METRICS_PORT": str(port), **(env or {})})
    urls = wait_for(lambda: (read_stack_state(data_dir) or {}).get("metrics_endpoints"), 60,
                    what="the stack's endpoints")
    for url in set(urls.values()):
        wait_for(lambda u=url: healthy(u), 120, what=f"{url}/healthz")
    return RunningStack(settings, process, urls)

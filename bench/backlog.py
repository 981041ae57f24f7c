"""The policy engine catching up on a backlog of the features topic: its rate against the
rate the fleet adds to the backlog, and its memory.

A backlog builds up whenever the engine is behind: stopped for an upgrade, restarted
after a crash, or slower than the stream jobs for a while. It is caught up on only if the
engine reads faster than the fleet writes: ``workers`` feature events a second (a worker's
probe message a second, as ``bench scale`` assumes), and each batch then meets every
target many times.

``messages`` columns messages of ``rows`` rows each (healthy features, the workers in
turn, a second of event time per round of the fleet) on a fresh topic, then ``dsec up
--services policy-engine`` until its group has committed every message. Printed: the
feature events per second from its first commit to its last, that rate over the fleet's
(``catch_up_vs_fleet_rate``: above 1 the backlog shrinks), the process's resident memory
at its first commit and its peak (the kernel's high-water mark, ``VmHWM``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pybase64
from confluent_kafka import Consumer, Producer, TopicPartition

from dsec.bench.bench_topics import bench_topics
from dsec.bench.pipeline import _group_progress
from dsec.bench.policy_eval import HEALTHY
from dsec.bench.service_processes import status_bytes
from dsec.infra.kafka_clients import producer_config
from dsec.infra.kafka_local import die_with_parent
from dsec.schemas import FeatureEvent, WorkerIdentity, encode, topic_names
from dsec.schemas.feature_columns import FeatureColumns, pack_feature_events
from dsec.schemas.metrics import PackedColumn
from dsec.schemas.settings import DsecSettings
from dsec.services.stack import stop_process, stream_group

__all__ = ["BacklogOptions", "run_backlog_bench"]

@dataclass(frozen=True)
class BacklogOptions:
    messages: int = 1500
    rows: int = 1000
    workers: int = 10_000
    partitions: int = 6
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if self.workers % self.rows:
            raise ValueError("rows must divide workers: every message holds as many rows")


def _slices(options: BacklogOptions) -> list[FeatureColumns]:
    """One message per ``rows`` workers, as a stream job packs them."""
    messages = []
    for start in range(0, options.workers, options.rows):
        events = [FeatureEvent(
            identity=WorkerIdentity(job_id="backlog", worker_id=f"w{worker}",
                                    node_id=f"n{worker // 8}"),
            event_time_ms=0, features=HEALTHY)
            for worker in range(start, min(start + options.rows, options.workers))]
        messages.append(pack_feature_events(events, f"slice-{start}", 0))
    return messages


def _fill(settings: DsecSettings, options: BacklogOptions) -> int:
    """The backlog on the features topic; the bytes it takes there (uncompressed)."""
    topic = topic_names(settings.topic_prefix).features
    producer = Producer(producer_config(settings, "dsec-bench-backlog"))
    slices = _slices(options)
    start_ms = int(time.time() * 1000) - 1000 * (options.messages // len(slices) + 1)
    sent_bytes = 0
    for index in range(options.messages):
        template = slices[index % len(slices)]
        rows = len(template.event_ids)
        time_ms = start_ms + 1000 * (index // len(slices))
        times = np.full(rows, time_ms, dtype="<i8").tobytes()
        message = template.model_copy(update={
            "event_id": uuid.uuid4().hex, "event_time_ms": time_ms,
            "event_ids": [uuid.uuid4().hex for _ in range(rows)],
            "event_times_ms": PackedColumn.model_construct(
                dtype="<i8", data=pybase64.b64encode(times).decode())})
        value = encode(message)
        sent_bytes += len(value)
        while True:
            try:
                producer.produce(topic, value, key=template.worker_ids[0].encode())
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("the backlog was not all delivered")
    return sent_bytes


def _catch_up(settings: DsecSettings, options: BacklogOptions, data_dir: Path) -> dict:
    services = frozenset({"policy-engine"})
    topic = topic_names(settings.topic_prefix).features
    env = {**os.environ, "DSEC_DATA_DIR": str(data_dir), "DSEC_METRICS_PORT": "0",
           "DSEC_TOPIC_PREFIX": settings.topic_prefix}
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / "engine.log").open("wb") as log:
        engine = subprocess.Popen(
            [sys.executable, "-m", "dsec.cli", "up", "--bootstrap", settings.bootstrap,
             "--services", ",".join(services)],
            env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    probe = Consumer({"bootstrap.servers": settings.bootstrap,
                      "group.id": stream_group(settings, services),
                      "enable.auto.commit": False, **settings.kafka_security()})
    try:
        metadata = probe.list_topics(topic, timeout=10)
        partitions = [TopicPartition(topic, p) for p in metadata.topics[topic].partitions]
        first: tuple[float, int] | None = None
        first_rss_bytes = None
        deadline = time.monotonic() + options.timeout_s
        while True:
            if engine.poll() is not None:
                raise RuntimeError(f"the engine exited; see {data_dir / 'engine.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError("the engine did not catch up in time")
            progress = _group_progress(probe, partitions)
            now = time.perf_counter()
            if progress and first is None:
                first = (now, progress)
                first_rss_bytes = status_bytes(engine.pid, "VmRSS")
            if progress >= options.messages:
                break
            time.sleep(0.05)
        assert first is not None
        elapsed_s = now - first[0]
        events = (options.messages - first[1]) * options.rows
        # A backlog read before the first look at the group's offsets has no rate to give.
        rate = events / elapsed_s if events and elapsed_s > 0 else None
        return {
            "catch_up_s": elapsed_s,
            "feature_events_per_s": rate,
            "catch_up_vs_fleet_rate": None if rate is None else rate / options.workers,
            "rss_at_first_commit_mb": (first_rss_bytes or 0) / (1 << 20),
            "peak_rss_mb": (status_bytes(engine.pid, "VmHWM") or 0) / (1 << 20),
        }
    finally:
        probe.close()
        stop_process(engine, timeout_s=60)


def run_backlog_bench(options: BacklogOptions, bootstrap: str | None = None) -> dict:
    with bench_topics("backlog", "backlog", options.partitions, bootstrap) as (work, settings):
        message_bytes = _fill(settings, options) / options.messages
        return {
            **_catch_up(settings, options, work / "engine"),
            "messages": options.messages,
            "rows_per_message": options.rows,
            "mean_message_bytes": message_bytes,
            "backlog_mb": message_bytes * options.messages / 1e6,
            "feature_events": options.messages * options.rows,
            "workers": options.workers,
            "partitions": options.partitions,
        }

"""The metrics stream job as its whole process, at probe rates: what ``dsec bench scale``'s
``MetricsJob`` stage leaves out (Faust's and the Kafka clients' work per message: fetching,
the stream's events, the outputs and the table's changelog sent, offsets committed).

A local broker's metrics topic is filled with ``seconds`` of every worker's one-second
probe messages (those of ``scale_fleet``, dated in the recent past); then ``dsec up
--services stream-jobs`` works through them, timed between its first and its last
commit, as ``dsec bench pipeline`` times it.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

from confluent_kafka import Producer

from dsec.bench.pipeline import PipelineBenchOptions, messages_in, pipeline_rate
from dsec.bench.scale_fleet import ProbeRates, worker_second
from dsec.infra.kafka_clients import producer_config
from dsec.infra.kafka_local import LocalKafka
from dsec.infra.topics import ensure_topics
from dsec.schemas import encode, now_ms, topic_names
from dsec.schemas.settings import DsecSettings

PARTITIONS = 6


def _fill(settings: DsecSettings, topic: str, workers: int, seconds: int,
          rates: ProbeRates) -> int:
    """Every worker's messages, a second of the fleet at a time; how many were sent."""
    producer = Producer(producer_config(settings, "dsec-bench-scale-process",
                                        **{"queue.buffering.max.messages": 200_000}))
    start_ms = now_ms() - (seconds + 60) * 1000  # in the past: the store refuses the future
    for second in range(seconds):
        for worker in range(workers):
            batch = worker_second(worker, second, rates, start_ms)
            producer.produce(topic, key=batch.identity.worker_id.encode(), value=encode(batch))
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("could not fill the metrics topic")
    return workers * seconds


def measure_stream_process(workers: int, seconds: int, bootstrap: str | None = None,
                           timeout_s: float = 600.0) -> dict:
    """The stream-job process over ``workers`` workers' ``seconds`` of probe messages: its
    messages and feature events per second, and its CPU per message. ``bootstrap``: a
    broker to use, on topics of their own; by default one started here."""
    rates = ProbeRates()
    work = Path(tempfile.mkdtemp(prefix="dsec-bench-scale-process-"))
    kafka = None if bootstrap else LocalKafka(data_dir=work / "kafka")
    try:
        if kafka is not None:
            bootstrap = kafka.start()
        settings = DsecSettings(bootstrap=bootstrap,
                                topic_prefix=f"scale{uuid.uuid4().hex[:8]}",
                                data_dir=work / "data")
        settings.data_dir.mkdir(parents=True)
        ensure_topics(settings, partitions=PARTITIONS)
        topics = topic_names(settings.topic_prefix)
        messages = _fill(settings, topics.metrics, workers, seconds, rates)
        per_message = rates.samples_per_s()
        options = PipelineBenchOptions(samples=messages, samples_per_message=1,
                                       partitions=PARTITIONS, timeout_s=timeout_s)
        rate = pipeline_rate(settings, topics.metrics, messages, options, settings.data_dir,
                             frozenset({"stream-jobs"}))
        messages_per_s = rate["stream_job_samples_per_s"]  # one "sample" a message here
        cpu_per_million = rate["stream_job_cpu_s_per_million_samples"]
        features = messages_in(settings, topics.features)
        return {
            "workers": workers,
            "messages": messages,
            "messages_per_s": messages_per_s,
            "samples_per_s": messages_per_s * per_message,
            "feature_events": features,
            "feature_events_per_s": messages_per_s * features / messages,
            "cpu_s_per_message": None if cpu_per_million is None else cpu_per_million / 1e6,
            "dead_letters": messages_in(settings, topics.dead_letters),
        }
    finally:
        if kafka is not None:
            kafka.stop()
        shutil.rmtree(work, ignore_errors=True)

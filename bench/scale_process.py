"""The metrics stream job as its whole process, at probe rates: what ``dsec bench scale``'s
``MetricsJob`` stage leaves out (Faust's and the Kafka clients' work per message: fetching,
the stream's events, the outputs and the table's changelog sent, offsets committed).

A local broker's metrics topic is filled with ``seconds`` of every worker's one-second
probe messages (those of ``scale_fleet``, dated in the recent past); then ``dsec up
--services stream-jobs`` works through them, timed between its first and its last
commit, as ``dsec bench pipeline`` times it.
"""

from __future__ import annotations

import itertools
from typing import Any

from confluent_kafka import Producer

from dsec.bench.bench_topics import bench_topics
from dsec.bench.pipeline import (
    PipelineBenchOptions,
    feature_events_in,
    messages_in,
    pipeline_rate,
)
from dsec.bench.scale_fleet import ProbeRates, worker_second
from dsec.infra.kafka_clients import producer_config
from dsec.schemas import MetricBatch, MetricColumns, encode, now_ms, topic_names
from dsec.schemas.settings import DsecSettings

PARTITIONS = 6


def split_flushes(batch: MetricBatch, flushes: int) -> list[MetricBatch]:
    """A worker's second as ``flushes`` probe messages: each kind's samples in time order,
    cut into that many runs as even as they can be (a kind with fewer samples than
    flushes is spread over them); a flush with no sample sends nothing, as the probe's
    does not."""
    assert batch.columns is not None
    parts: list[dict[str, Any]] = [{} for _ in range(flushes)]
    for kind, columns in batch.columns.kinds().items():
        n = len(columns)
        cuts = [-(-n * k // flushes) for k in range(flushes + 1)]  # ceil(n * k / flushes)
        for index, (start, stop) in enumerate(itertools.pairwise(cuts)):
            if stop > start:
                parts[index][kind] = columns.model_copy(update={
                    name: None if values is None else values[start:stop]
                    for name, values in columns.__dict__.items()})
    return [batch.model_copy(update={"event_id": f"{batch.event_id}-{index}",
                                     "columns": MetricColumns(**kinds)})
            for index, kinds in enumerate(parts) if kinds]


def _fill(settings: DsecSettings, topic: str, workers: int, seconds: int,
          rates: ProbeRates, flushes_per_s: int) -> int:
    """Every worker's messages, a second of the fleet at a time; how many were sent."""
    producer = Producer(producer_config(settings, "dsec-bench-scale-process",
                                        **{"queue.buffering.max.messages": 200_000}))
    start_ms = now_ms() - (seconds + 60) * 1000  # in the past: the store refuses the future
    sent = 0
    for second in range(seconds):
        for worker in range(workers):
            batch = worker_second(worker, second, rates, start_ms)
            for flush in split_flushes(batch, flushes_per_s):
                producer.produce(topic, key=batch.identity.worker_id.encode(),
                                 value=encode(flush))
                producer.poll(0)
                sent += 1
    if producer.flush(120) != 0:
        raise RuntimeError("could not fill the metrics topic")
    return sent


def measure_stream_process(workers: int, seconds: int, flushes_per_s: int = 1,
                           bootstrap: str | None = None, timeout_s: float = 600.0) -> dict:
    """The stream-job process over ``workers`` workers' ``seconds`` of probe messages,
    each worker's second sent as ``flushes_per_s`` messages: its messages and feature
    events per second, its CPU per message, and the cores that CPU would take at
    100,000 workers. ``bootstrap``: a broker to use, on topics of their
    own; by default one started here."""
    rates = ProbeRates()
    with bench_topics("scale-process", "scale", PARTITIONS, bootstrap) as (_, settings):
        topics = topic_names(settings.topic_prefix)
        messages = _fill(settings, topics.metrics, workers, seconds, rates, flushes_per_s)
        per_message = rates.samples_per_s() * workers * seconds / messages
        options = PipelineBenchOptions(samples=messages, samples_per_message=1,
                                       partitions=PARTITIONS, timeout_s=timeout_s)
        rate = pipeline_rate(settings, topics.metrics, messages, options, settings.data_dir,
                             frozenset({"stream-jobs"}))
        messages_per_s = rate["stream_job_samples_per_s"]  # one "sample" a message here
        cpu_per_million = rate["stream_job_cpu_s_per_million_samples"]
        features = feature_events_in(settings, topics.features)
        return {
            "workers": workers,
            "messages": messages,
            "messages_per_s": messages_per_s,
            "samples_per_s": messages_per_s * per_message,
            "feature_events": features,
            "feature_messages": messages_in(settings, topics.features),
            "feature_events_per_s": messages_per_s * features / messages,
            "flushes_per_s": flushes_per_s,
            "cpu_s_per_message": None if cpu_per_million is None else cpu_per_million / 1e6,
            "cores_per_100k_workers": None if cpu_per_million is None
            else cpu_per_million / 1e6 * messages / (workers * seconds) * 100_000,
            "dead_letters": messages_in(settings, topics.dead_letters),
        }

"""``dsec bench pipeline``: the stream jobs' throughput against a bare consumer's, one topic.

1. A topic is filled with probe-shaped batches (packed columns, ``samples_per_message``
   each), as the probe sends them.
2. A bare confluent-kafka consumer reads and decodes every message (orjson, then each
   column into a numpy array, base64 by pybase64 as in the stream jobs): the practical
   limit of a Python consumer. Then the same consumer with the stream jobs' own
   decoder, which checks every column against the model (``validated``): the least a
   consumer of untrusted messages does.
3. The stream stack (``dsec up --services stream-jobs,sink`` on the same broker: the Faust
   metrics job, and the ClickHouse sink in a process of its own) works through them;
   its rate is taken between its first and last commit on the topic, so start-up
   is not counted, and it includes features, GPU profiles and the ClickHouse writes.
4. The limit side (``pipeline_limit``): a bare consumer that decodes and inserts the raw
   samples into plain MergeTree tables, no features and no deduplication, run before the
   stack and again after it; ``ratio_to_limit`` is the pipeline's rate over the mean of
   its two rates (both printed).

Each side's CPU time per million samples is printed too (the bare consumer's process, the
stream-job process and the sink's; Linux only): what each costs, whatever the rates; and
the stream job's over the bare and the validating consumer's (``stream_job_cpu_vs_raw``,
``stream_job_cpu_vs_validated``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from dsec.bench import PIPELINE_SAMPLES
from dsec.bench.bench_topics import bench_topics
from dsec.bench.pipeline_limit import consume_batch, decoded_columns, limit_rate
from dsec.bench.traces import bench_identities, training_batch
from dsec.infra.consumer_loop_types import BatchWriter
from dsec.infra.kafka_clients import BULK_FETCH, consumer_config, producer_config
from dsec.schemas import now_ms, topic_names
from dsec.schemas.fast_decode import decode_metric_batch
from dsec.schemas.metrics import encode_packed
from dsec.schemas.settings import DsecSettings
from dsec.services.restored_loop import read_to_end
from dsec.services.stack import sink_group, stream_group

BENCH_SERVICES = frozenset({"stream-jobs", "sink"})  # the policy engine reads features only


@dataclass(frozen=True)
class PipelineBenchOptions:
    samples: int = PIPELINE_SAMPLES
    samples_per_message: int = 1000
    workers: int = 32
    partitions: int = 6
    timeout_s: float = 600.0


def _fill(settings: DsecSettings, topic: str, options: PipelineBenchOptions) -> int:
    producer = Producer(producer_config(settings, "dsec-bench-pipeline",
                                        **{"queue.buffering.max.messages": 100_000}))
    messages = options.samples // options.samples_per_message
    # dated an hour back: inside the stores' event-time window, which refuses the future
    start_ms = now_ms() - 3_600_000
    identities = bench_identities(options.workers, start_ms)
    payloads = {}
    for index in range(messages):
        ident = identities[index % options.workers]
        # Distinct batches per worker, reused across rounds with fresh ids: encoding two
        # million samples would otherwise take longer than the measurement.
        template = payloads.get(ident.worker_id)
        if template is None:
            template = payloads[ident.worker_id] = training_batch(
                ident, index, options.samples_per_message)
        batch = template.model_copy(update={"event_id": f"bench-{uuid.uuid4().hex}"})
        producer.produce(topic, key=ident.worker_id.encode(), value=encode_packed(batch))
        producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("could not fill the benchmark topic")
    return messages


def _decode_columns(value: bytes) -> int:
    """What a bare consumer does with a message: every column into an array (with the
    stream jobs' base64 decoder, so that only the work around it differs)."""
    return sum(next(iter(columns.values())).size
               for columns in decoded_columns(orjson.loads(value)).values() if columns)


def _decode_validated(value: bytes) -> int:
    """What a consumer of untrusted messages does at the least: the stream jobs' own
    decoder, every column checked against the model's types and bounds."""
    return decode_metric_batch(value).sample_count()


def _cpu_s(pid: int) -> float | None:
    """User and system CPU seconds a process has used so far (None where /proc is not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _child_pids(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(entry.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return children


def _per_million(cpu_s: float | None, samples: int) -> float | None:
    return None if cpu_s is None or samples <= 0 else round(cpu_s * 1e6 / samples, 3)


def _raw_rate(
    settings: DsecSettings, topic: str, messages: int,
    decode_message: Callable[[bytes], int] = _decode_columns,
) -> tuple[float, float, float | None]:
    """(samples/s, messages/s, CPU seconds per million samples counted) of a consumer
    that decodes each message with ``decode_message`` (which counts its samples)."""
    # The same client settings as the sink's consumer: only what is done per message differs.
    consumer = Consumer(consumer_config(settings, f"bench-raw-{uuid.uuid4().hex}", **BULK_FETCH))
    metadata = consumer.list_topics(topic, timeout=10)
    consumer.assign([TopicPartition(topic, p, 0) for p in metadata.topics[topic].partitions])
    read = 0
    # The clock starts when the first batch has arrived, so that batch, fetched before
    # it started, is not counted: the stream stack's rate likewise starts at its first
    # commit and leaves the messages before it out.
    started = None
    cpu_started_s = 0.0
    counted_messages = counted_samples = 0
    while read < messages:
        # A short wait: with a long one, the last call (short of a full batch) waits out
        # its timeout for messages that are not coming, and that second counts.
        batch = consumer.consume(consume_batch(messages), 0.05)
        for message in batch:
            if message.error():
                continue
            decoded = decode_message(message.value())
            read += 1
            if started is not None:
                counted_samples += decoded
                counted_messages += 1
        if started is None and batch:
            started, cpu_started_s = time.perf_counter(), time.process_time()
    elapsed = time.perf_counter() - (started or time.perf_counter())
    cpu_s = time.process_time() - cpu_started_s
    consumer.close()
    return (counted_samples / elapsed, counted_messages / elapsed,
            _per_million(cpu_s, counted_samples))


_COORDINATOR_MOVING = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                                 KafkaError.COORDINATOR_LOAD_IN_PROGRESS})


def _group_progress(probe: Consumer, partitions: list[TopicPartition]) -> int:
    """Messages the group has committed; 0 while its coordinator is moving or loading,
    as on a broker just started (the next poll asks again)."""
    try:
        committed = probe.committed(partitions, timeout=10)
    except KafkaException as error:
        if error.args and (error.args[0].code() in _COORDINATOR_MOVING
                           or error.args[0].retriable()):
            return 0
        raise
    return sum(max(tp.offset, 0) for tp in committed)


def pipeline_rate(
    settings: DsecSettings, topic: str, messages: int, options: PipelineBenchOptions,
    data_dir: Path, services: frozenset[str] = BENCH_SERVICES,
) -> dict[str, float]:
    """``dsec up --services …`` over the ``messages`` on ``topic``: per group (the stream
    job's, and the sink's where it runs), its rate and its process's CPU per million
    samples between its first and its last commit; and the whole stack's rate."""
    env = {**os.environ, "DSEC_DATA_DIR": str(data_dir),
           "DSEC_TOPIC_PREFIX": settings.topic_prefix}
    log = (data_dir / "stack.log").open("wb")
    stack = subprocess.Popen(
        [sys.executable, "-m", "dsec.cli", "up", "--bootstrap", settings.bootstrap,
         "--services", ",".join(sorted(services))],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    groups = {"stream_job": stream_group(settings, services)}
    if "sink" in services:
        groups["sink"] = sink_group(settings)
    probes = {name: Consumer({"bootstrap.servers": settings.bootstrap, "group.id": group,
                              "enable.auto.commit": False, **settings.kafka_security()})
              for name, group in groups.items()}
    try:
        metadata = probes["stream_job"].list_topics(topic, timeout=10)
        partitions = [TopicPartition(topic, p) for p in metadata.topics[topic].partitions]
        first: dict[str, tuple[float, int]] = {}
        done: dict[str, float] = {}
        # CPU seconds of the process doing each group's work, at its first and last commit
        pids: dict[str, int | None] = {"stream_job": stack.pid, "sink": None}
        cpu_first: dict[str, float | None] = {}
        cpu_done: dict[str, float | None] = {}
        deadline = time.monotonic() + options.timeout_s
        while len(done) < len(groups):
            if stack.poll() is not None:
                raise RuntimeError(f"the stack exited; see {data_dir / 'stack.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError("the stack did not finish in time")
            now = time.perf_counter()
            if "sink" in groups and pids["sink"] is None and not first:
                # The sink's own process: the stack starts it before its stream jobs, so it
                # is there by the first commit; a sink inside the stack has no figure of its own.
                pids["sink"] = next(iter(_child_pids(stack.pid)), None)
            for name, probe in probes.items():
                if name in done:
                    continue
                progress = _group_progress(probe, partitions)
                pid = pids[name]
                if progress and name not in first:
                    first[name] = (now, progress)
                    cpu_first[name] = None if pid is None else _cpu_s(pid)
                if progress >= messages:
                    done[name] = now
                    cpu_done[name] = None if pid is None else _cpu_s(pid)
            time.sleep(0.05)
        rates = {}
        per_message = options.samples_per_message
        for name in groups:
            started, offset = first[name]
            elapsed = max(done[name] - started, 1e-9)
            rates[f"{name}_samples_per_s"] = (messages - offset) * per_message / elapsed
            before, after = cpu_first.get(name), cpu_done.get(name)
            rates[f"{name}_cpu_s_per_million_samples"] = _per_million(
                None if before is None or after is None else after - before,
                (messages - offset) * per_message)
        started = min(t for t, _ in first.values())
        offset = min(o for _, o in first.values())
        elapsed = max(max(done.values()) - started, 1e-9)  # 0 where one commit took all
        rates["pipeline_samples_per_s"] = (messages - offset) * per_message / elapsed
        rates["pipeline_messages_per_s"] = (messages - offset) / elapsed
        return rates
    finally:
        for probe in probes.values():
            probe.close()
        stack.send_signal(signal.SIGINT)
        try:
            stack.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stack.kill()


def messages_in(settings: DsecSettings, topic: str) -> int:
    """How many messages ``topic`` holds: the sum of its partitions' high watermarks."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": "dsec-bench-count",
                         **settings.kafka_security()})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in metadata.partitions)
    finally:
        consumer.close()


class _FeatureEventCount(BatchWriter[int]):
    """Counts the feature events of the messages it is handed, whichever their form."""

    def __init__(self) -> None:
        self.events = 0

    def prepare(self, messages: Sequence[Message]) -> int:
        from dsec.schemas.feature_columns import feature_events

        return sum(len(feature_events(message.value())) for message in messages)

    def write(self, batch: int) -> None:
        self.events += batch


def feature_events_in(settings: DsecSettings, topic: str, timeout_s: float = 60.0) -> int:
    """How many feature events the features ``topic`` holds, whichever form each message
    has (one event, or a ``FeatureColumns`` message of many), read to its ends."""
    count = _FeatureEventCount()
    read_to_end(settings, [topic], count, group_prefix="dsec-bench-count",
                service="bench", what="the features topic", timeout_s=timeout_s)
    return count.events


def _ratio(rate: float, limit: float) -> float | None:
    """None where a side timed nothing: a run so short that its first batch (or the stack's
    first commit), which the clock starts after, held every message."""
    return round(rate / limit, 3) if rate > 0 and limit > 0 else None


def run_pipeline_bench(options: PipelineBenchOptions, bootstrap: str | None = None) -> dict:
    with bench_topics("pipeline", "bench", options.partitions, bootstrap) as (work, settings):
        topic = topic_names(settings.topic_prefix).metrics
        messages = _fill(settings, topic, options)
        raw_samples_per_s, raw_messages_per_s, raw_cpu = _raw_rate(settings, topic, messages)
        validated_samples_per_s, _, validated_cpu = _raw_rate(settings, topic, messages,
                                                              _decode_validated)
        before = limit_rate(settings, topic, messages, work / "limit-store-before")
        pipeline = pipeline_rate(settings, topic, messages, options, settings.data_dir)
        after = limit_rate(settings, topic, messages, work / "limit-store-after")
        # the limit side on either side of the pipeline, so a change in the machine's load
        # during the run weighs on both sides of the ratio (a side that timed nothing, all
        # its messages in its first batch, is left out)
        timed = [side for side in (before, after) if side[0] > 0] or [before]
        limit_samples_per_s, limit_messages_per_s, limit_cpu = (
            sum(values) / len(timed) for values in zip(*timed, strict=True))
        # a bench whose messages were dead-lettered measured the wrong path: say so
        dead_letters = messages_in(settings, topic_names(settings.topic_prefix).dead_letters)
        return {
            "raw_samples_per_s": round(raw_samples_per_s),
            "raw_messages_per_s": round(raw_messages_per_s),
            "pipeline_samples_per_s": round(pipeline["pipeline_samples_per_s"]),
            "pipeline_messages_per_s": round(pipeline["pipeline_messages_per_s"]),
            "ratio": _ratio(pipeline["pipeline_samples_per_s"], raw_samples_per_s),
            "validated_samples_per_s": round(validated_samples_per_s),
            "limit_samples_per_s": round(limit_samples_per_s),
            "limit_messages_per_s": round(limit_messages_per_s),
            "limit_samples_per_s_before_and_after": [round(before[0]), round(after[0])],
            "ratio_to_limit": _ratio(pipeline["pipeline_samples_per_s"], limit_samples_per_s),
            "stream_job_samples_per_s": round(pipeline["stream_job_samples_per_s"]),
            "sink_samples_per_s": round(pipeline["sink_samples_per_s"]),
            "cpu_s_per_million_samples": {
                "raw": raw_cpu,
                "validated": validated_cpu,
                "limit": round(limit_cpu, 3),
                "stream_job": pipeline["stream_job_cpu_s_per_million_samples"],
                "sink": pipeline["sink_cpu_s_per_million_samples"],
            },
            "stream_job_cpu_vs_raw": _ratio(
                pipeline["stream_job_cpu_s_per_million_samples"] or 0, raw_cpu or 0),
            "stream_job_cpu_vs_validated": _ratio(
                pipeline["stream_job_cpu_s_per_million_samples"] or 0, validated_cpu or 0),
            "samples": messages * options.samples_per_message,
            "messages": messages,
            "dead_letters": dead_letters,
            "samples_per_message": options.samples_per_message,
            "partitions": options.partitions,
            "cpu_count": os.cpu_count(),
        }

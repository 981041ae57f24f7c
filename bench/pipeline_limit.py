"""The limit side of ``dsec bench pipeline``: what a bare consumer reaches when it only
decodes the probe's messages and inserts their samples into ClickHouse.

A confluent-kafka consumer with the sink's client settings reads the same topic, decodes
every column into a numpy array, and inserts each sample kind's columns, one Arrow insert
per kind and fetched batch, with clickhouse-connect into a plain MergeTree table: no
features, no insert deduplication, no offsets stored with the rows. The pipeline's rate
over this one is what dsec's stream jobs and sink cost on top of moving the data.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pybase64
from confluent_kafka import Consumer, TopicPartition

from dsec.infra.kafka_clients import BULK_FETCH, consumer_config
from dsec.infra.store.clickhouse import connect
from dsec.schemas.frames import FIELD_DTYPES
from dsec.schemas.settings import DsecSettings

_TYPES = {np.int64: "Nullable(Int64)", np.float64: "Nullable(Float64)", np.bool_: "Nullable(Bool)"}
_ARROW = {np.int64: pa.int64(), np.float64: pa.float64(), np.bool_: pa.bool_()}


def decoded_columns(document: dict) -> dict[str, dict[str, np.ndarray]]:
    """Every column of a packed metric batch as an array, by sample kind (base64 by
    pybase64, as in the stream jobs)."""
    return {kind: {name: (np.frombuffer(pybase64.b64decode(value["data"]), dtype=value["dtype"])
                          if isinstance(value, dict) else np.asarray(value))
                   for name, value in columns.items()}
            for kind, columns in document["columns"].items()}


def limit_table_statements() -> list[str]:
    """One plain MergeTree table per sample kind, the fields' own types, no codecs."""
    statements = []
    for kind, fields in FIELD_DTYPES.items():
        columns = ", ".join(f"{name} {_TYPES.get(dtype, 'Nullable(String)')}"
                            for name, dtype in fields.items())
        statements.append(f"CREATE TABLE IF NOT EXISTS limit_{kind} ({columns}) "
                          "ENGINE = MergeTree ORDER BY tuple()")
    return statements


def arrow_tables(batches: list[dict[str, dict[str, np.ndarray]]]) -> dict[str, pa.Table]:
    """The decoded batches' columns, one Arrow chunk per batch and kind (no per-sample
    Python objects); a field a batch lacks is null."""
    tables = {}
    for kind, fields in FIELD_DTYPES.items():
        frames = [batch[kind] for batch in batches if kind in batch]
        if not frames:
            continue
        columns = {}
        for name, dtype in fields.items():
            arrow_type = _ARROW.get(dtype, pa.string())
            columns[name] = pa.chunked_array(
                [pa.nulls(frame["event_time_ms"].size, arrow_type) if name not in frame
                 else pa.array(frame[name], type=arrow_type) for frame in frames],
                type=arrow_type)
        tables[kind] = pa.table(columns)
    return tables


def consume_batch(messages: int) -> int:
    """Messages per ``consume`` call: 1,000, and fewer for a short run, so that it takes at
    least ten calls (the first, fetched before the clock starts, is not counted)."""
    return max(1, min(1000, messages // 10))


def limit_rate(settings: DsecSettings, topic: str, messages: int,
               store_dir: Path) -> tuple[float, float, float]:
    """(samples/s, messages/s, CPU seconds per million samples), timed from the first
    fetched batch as the other sides are."""
    client = connect(f"chdb://{store_dir}")
    for statement in limit_table_statements():
        client.command(statement)
    consumer = Consumer(consumer_config(settings, f"bench-limit-{uuid.uuid4().hex}",
                                        **BULK_FETCH))
    metadata = consumer.list_topics(topic, timeout=10)
    consumer.assign([TopicPartition(topic, p, 0) for p in metadata.topics[topic].partitions])
    read = counted_messages = counted_samples = 0
    started = None
    cpu_started_s = 0.0
    try:
        while read < messages:
            batch = [m for m in consumer.consume(consume_batch(messages), 0.05)
                     if not m.error()]
            if not batch:
                continue
            decoded = [decoded_columns(orjson.loads(m.value())) for m in batch]
            for kind, table in arrow_tables(decoded).items():
                client.insert_arrow(f"limit_{kind}", table)
            read += len(batch)
            if started is None:  # the first batch was fetched before the clock: not counted
                started, cpu_started_s = time.perf_counter(), time.process_time()
                continue
            counted_messages += len(batch)
            counted_samples += sum(columns["event_time_ms"].size for document in decoded
                                   for columns in document.values())
        elapsed = time.perf_counter() - (started or time.perf_counter())
        cpu_s = time.process_time() - cpu_started_s
    finally:
        consumer.close()
        client.close()
    elapsed = max(elapsed, 1e-9)
    per_million = cpu_s * 1e6 / counted_samples if counted_samples else float("nan")
    return counted_samples / elapsed, counted_messages / elapsed, round(per_million, 3)

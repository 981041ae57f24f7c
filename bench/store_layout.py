"""``dsec bench store-layout``: what the raw samples cost to insert and to keep in the
store's layout against one row per sample, on the same messages, side by side.

- ``per_message``: the store's raw tables as the sink writes them (``raw_schema`` and
  ``RawColumnsBuilder``): one row per probe message and sample kind, the message's identity
  once and each field's samples as an array under its codec, read through the per-sample
  views named as the raw tables.
- ``per_sample``: one row per sample (``per_sample_statements`` and ``per_sample_tables``),
  sorted by job, worker and time, each column compressed by the same codec: the layout a
  store keeps for a kind it had before ``raw_schema``.

Both are embedded ClickHouse engines in this process (chDB), in databases of their own,
and take the same batches of the same messages, each layout's batches alternating with the
other's. For each it prints the CPU seconds per million samples to build the Arrow tables
and to insert them (the process's CPU time, ClickHouse's threads included), the bytes on
disk per sample from ``system.parts`` after ``OPTIMIZE … FINAL``, and the median time of
per-sample reads (``QUERIES``), the same SQL on both. Whether both layouts gave the same
answers is printed too.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from dsec.bench.traces import bench_identities, training_batch
from dsec.infra.store.clickhouse import connect
from dsec.infra.store.raw_columns import IDENTITY_COLUMNS, RawColumnsBuilder, raw_table_name
from dsec.infra.store.raw_schema import (
    message_table_statement,
    sample_column_type,
    sample_view_statement,
)
from dsec.schemas import now_ms
from dsec.schemas.fast_decode import DecodedBatch, decode_metric_batch
from dsec.schemas.frames import FIELD_DTYPES
from dsec.schemas.metrics import encode_packed

__all__ = ["StoreLayoutOptions", "per_sample_statements", "per_sample_tables", "probe_messages",
           "run_store_layout_bench"]

LAYOUTS = ("per_sample", "per_message")
# per-sample reads, the same text on both layouts (``{db}``: the layout's database)
QUERIES = {
    "all_workers": "SELECT worker_id, count(), round(avg(loss), 6), max(grad_norm) "
                   "FROM {db}.raw_step GROUP BY worker_id ORDER BY worker_id",
    "one_worker": "SELECT count(), round(avg(grad_norm), 6), max(event_time), max(seq) "
                  "FROM {db}.raw_step WHERE worker_id = 'worker-001'",
}
QUERY_RUNS = 5


@dataclass(frozen=True)
class StoreLayoutOptions:
    messages: int = 400
    samples_per_message: int = 1000
    workers: int = 32
    batch_messages: int = 100  # messages per insert, as a sink batch


def per_sample_statements(ttl_days: int = 30) -> list[str]:
    """One table per sample kind, one row per sample, the store's codecs: the raw tables
    of a store made before ``raw_schema``."""
    statements = []
    for kind, fields in FIELD_DTYPES.items():
        columns = ["event_time DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1))",
                   "seq UInt32 CODEC(T64, ZSTD(1))",
                   *(f"{name} LowCardinality(String)" for name in IDENTITY_COLUMNS)]
        if "gpu_uuid" not in fields:
            columns.append("gpu_uuid LowCardinality(String)")
        columns += [f"{name} {sample_column_type(name, dtype)}"
                    for name, dtype in fields.items() if name != "event_time_ms"]
        columns.append("ingest_time DateTime64(3, 'UTC') DEFAULT now64(3) "
                       "CODEC(DoubleDelta, ZSTD(1))")
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {raw_table_name(kind)} ({', '.join(columns)}) "
            "ENGINE = MergeTree PARTITION BY toDate(event_time) "
            "ORDER BY (job_id, worker_id, event_time) "
            f"TTL toDateTime(event_time) + INTERVAL {int(ttl_days)} DAY "
            "SETTINGS non_replicated_deduplication_window = 10000")
    return statements


def _dictionary(values: list[str], index: np.ndarray) -> pa.DictionaryArray:
    distinct, inverse = np.unique(np.asarray(values, dtype=object), return_inverse=True)
    return pa.DictionaryArray.from_arrays(pa.array(inverse.astype(np.int32)[index]),
                                          pa.array(distinct.tolist()))


def per_sample_tables(batches: Sequence[DecodedBatch]) -> dict[str, pa.Table]:
    """One Arrow table per sample kind, a row per sample: identities by dictionary, ``seq``
    numbering each message's samples of the kind from 0."""
    out = {}
    for kind, fields in FIELD_DTYPES.items():
        rows = [(b.header, b.frames[kind]) for b in batches
                if kind in b.frames and b.frames[kind]["event_time_ms"].size]
        if not rows:
            continue
        sizes = [frame["event_time_ms"].size for _, frame in rows]
        message = np.repeat(np.arange(len(rows)), sizes)
        arrays: dict[str, pa.Array] = {
            "event_time": pa.array(np.concatenate([f["event_time_ms"] for _, f in rows]),
                                   type=pa.timestamp("ms", tz="UTC")),
            "seq": pa.array(np.concatenate([np.arange(n, dtype=np.uint32) for n in sizes])),
        }
        for name in IDENTITY_COLUMNS:
            arrays[name] = _dictionary([getattr(h.identity, name) for h, _ in rows], message)
        if "gpu_uuid" not in fields:
            arrays["gpu_uuid"] = _dictionary([h.gpu_uuid or "" for h, _ in rows], message)
        for name, dtype in fields.items():
            if name == "event_time_ms":
                continue
            column = np.concatenate([frame[name] for _, frame in rows])
            arrays[name] = (pa.array(column, type=pa.string()) if dtype is object
                            else pa.array(column, from_pandas=dtype is np.float64))
        out[raw_table_name(kind)] = pa.table(arrays)
    return out


def _per_message_tables(batches: Sequence[DecodedBatch]) -> dict[str, pa.Table]:
    raw = RawColumnsBuilder()
    for batch in batches:
        raw.add(batch.header, batch.frames)
    return raw.tables()


def probe_messages(options: StoreLayoutOptions) -> list[DecodedBatch]:
    """Distinct probe messages, round-robin over the workers, each decoded as the sink
    decodes it."""
    # dated an hour back, as the pipeline bench's: inside the store's event-time window
    identities = bench_identities(options.workers, now_ms() - 3_600_000)
    return [decode_metric_batch(encode_packed(training_batch(
        identities[index % options.workers], index // options.workers,
        options.samples_per_message, seed=index % options.workers)))
        for index in range(options.messages)]


def _median_ms(client, sql: str) -> float:
    """The median wall time of ``QUERY_RUNS`` runs (call it after a run not counted)."""
    times_ms = []
    for _ in range(QUERY_RUNS):
        started = time.perf_counter()
        client.query(sql)
        times_ms.append(1e3 * (time.perf_counter() - started))
    return float(np.median(times_ms))


def run_store_layout_bench(options: StoreLayoutOptions, work: Path | None = None) -> dict:
    decoded = probe_messages(options)
    samples = sum(batch.sample_count() for batch in decoded)
    groups = [decoded[lo:lo + options.batch_messages]
              for lo in range(0, len(decoded), options.batch_messages)]
    builders: dict[str, Callable[[Sequence[DecodedBatch]], dict[str, pa.Table]]] = {
        "per_sample": per_sample_tables, "per_message": _per_message_tables}
    statements = {"per_sample": per_sample_statements(30),
                  "per_message": [*(message_table_statement(kind, 30) for kind in FIELD_DTYPES),
                                  *(sample_view_statement(kind) for kind in FIELD_DTYPES)]}
    with tempfile.TemporaryDirectory(dir=work) as store:
        client = connect(f"chdb://{store}")
        for layout in LAYOUTS:
            client.command(f"CREATE DATABASE IF NOT EXISTS {layout}")
            for statement in statements[layout]:
                client.command(re.sub(r"(EXISTS|VIEW|FROM) (raw_\w+)", rf"\1 {layout}.\2",
                                      statement))
        for layout in LAYOUTS:  # warm-up, not counted: the first build loads lazy parts
            builders[layout](groups[0])
        build_s = dict.fromkeys(LAYOUTS, 0.0)
        insert_s = dict.fromkeys(LAYOUTS, 0.0)
        for number, group in enumerate(groups):
            for layout in (LAYOUTS if number % 2 == 0 else LAYOUTS[::-1]):
                started = time.process_time()
                built = builders[layout](group)
                build_s[layout] += time.process_time() - started
                started = time.process_time()
                for table, arrow_table in built.items():
                    client.insert_arrow(f"{layout}.{table}", arrow_table, settings={
                        "insert_deduplication_token": f"{layout}-{table}-{number}"})
                insert_s[layout] += time.process_time() - started
        result: dict = {"messages": len(decoded), "samples": samples,
                        "batch_messages": options.batch_messages}
        for layout in LAYOUTS:
            parts = f"system.parts WHERE active AND database = '{layout}'"  # tables, not views
            for (table,) in client.query(f"SELECT DISTINCT table FROM {parts}").result_rows:
                client.command(f"OPTIMIZE TABLE {layout}.{table} FINAL")
            stored_bytes, rows = client.query(
                f"SELECT sum(bytes_on_disk), sum(rows) FROM {parts}").result_rows[0]
            result[layout] = {
                "build_cpu_s_per_million_samples": round(1e6 * build_s[layout] / samples, 3),
                "insert_cpu_s_per_million_samples": round(1e6 * insert_s[layout] / samples, 3),
                "bytes_per_sample": round(stored_bytes / samples, 2),
                "rows": int(rows),
            }
        answers = {}
        for layout in LAYOUTS:
            for name, sql in QUERIES.items():
                text = sql.format(db=layout)
                answers[(layout, name)] = client.query(text).result_rows  # the warm-up
                result[layout][f"{name}_query_ms"] = round(_median_ms(client, text), 2)
        result["query_answers_match"] = all(
            answers[("per_sample", name)] == answers[("per_message", name)] for name in QUERIES)
        client.close()
    per_sample, per_message = result["per_sample"], result["per_message"]
    result["insert_cpu_ratio"] = round(per_message["insert_cpu_s_per_million_samples"]
                                       / per_sample["insert_cpu_s_per_million_samples"], 3)
    result["build_and_insert_cpu_ratio"] = round(
        (per_message["build_cpu_s_per_million_samples"]
         + per_message["insert_cpu_s_per_million_samples"])
        / (per_sample["build_cpu_s_per_million_samples"]
           + per_sample["insert_cpu_s_per_million_samples"]), 3)
    for name in QUERIES:
        result[f"{name}_query_ratio"] = round(per_message[f"{name}_query_ms"]
                                              / max(per_sample[f"{name}_query_ms"], 1e-3), 3)
    result["bytes_ratio"] = round(per_message["bytes_per_sample"]
                                  / per_sample["bytes_per_sample"], 3)
    return result

"""``dsec bench store-layout``: what the raw samples cost to insert and to keep in the
store's layout against one row per probe message, on the same messages, side by side.

- ``per_sample``: the store's raw tables as the sink writes them (``raw_table_statements``
  and ``RawColumnsBuilder``): one row per sample, sorted by job, worker and time, each
  column compressed by its codec.
- ``per_message``: one row per probe message and sample kind, the message's identity once
  and each field's samples as an array (``Array(T)`` with the same codecs), sorted the
  same way by the message's first sample time.

Both are embedded ClickHouse engines in this process (chDB), in databases of their own,
and take the same batches of the same messages, each layout's batches alternating with the
other's. For each it prints the CPU seconds per million samples to build the Arrow tables
and to insert them (the process's CPU time, ClickHouse's threads included), the bytes on
disk per sample from ``system.parts`` after ``OPTIMIZE … FINAL``, and the median time of
per-sample reads (``QUERIES``), the same SQL on both: on the per-message layout they read
views named as the raw tables, which give one row per sample by ``ARRAY JOIN``. Whether
both layouts gave the same answers is printed too.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from dsec.bench.traces import bench_identities, training_batch
from dsec.infra.store.clickhouse import connect, raw_table_statements, sample_column_type
from dsec.infra.store.raw_columns import IDENTITY_COLUMNS, RawColumnsBuilder, raw_table_name
from dsec.schemas import now_ms
from dsec.schemas.fast_decode import DecodedBatch, decode_metric_batch
from dsec.schemas.frames import FIELD_DTYPES
from dsec.schemas.metrics import encode_packed

__all__ = ["StoreLayoutOptions", "message_table_statements", "message_tables", "probe_messages",
           "run_store_layout_bench", "sample_view_statements"]

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


def message_table_name(kind: str) -> str:
    return f"msg_{kind}"


def message_table_statements(ttl_days: int = 30) -> list[str]:
    """One table per sample kind, one row per message: the raw tables' codecs on arrays."""
    statements = []
    for kind, fields in FIELD_DTYPES.items():
        columns = ["event_time DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1))",
                   *(f"{name} LowCardinality(String)" for name in IDENTITY_COLUMNS),
                   "message_id String CODEC(ZSTD(1))"]
        if "gpu_uuid" not in fields:
            columns.append("gpu_uuid LowCardinality(String)")
        columns += [f"{_array_name(name)} {_array_type(name, dtype)}"
                    for name, dtype in fields.items()]
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {message_table_name(kind)} ({', '.join(columns)}) "
            "ENGINE = MergeTree PARTITION BY toDate(event_time) "
            "ORDER BY (job_id, worker_id, event_time) "
            f"TTL toDateTime(event_time) + INTERVAL {int(ttl_days)} DAY "
            "SETTINGS non_replicated_deduplication_window = 10000")
    return statements


def sample_view_statements(database: str | None = None) -> list[str]:
    """Per kind, a view named as the raw table that gives the per-message table's rows one
    row per sample (``ARRAY JOIN``), with the raw table's columns (``ingest_time`` aside);
    ``database``: the per-message tables' own, when not the current one."""
    within = f"{database}." if database else ""
    statements = []
    for kind, fields in FIELD_DTYPES.items():
        joined = ["times_ms AS sample_time_ms", "arrayEnumerate(times_ms) AS sample_number"]
        columns = ["fromUnixTimestamp64Milli(sample_time_ms, 'UTC') AS event_time",
                   "toUInt32(sample_number - 1) AS seq", *IDENTITY_COLUMNS]
        if "gpu_uuid" not in fields:
            columns.append("gpu_uuid")
        for name in fields:
            if name == "event_time_ms":
                continue
            array = _array_name(name)
            joined.append(name if array == name else f"{array} AS {name}")
            columns.append(name)
        statements.append(
            f"CREATE VIEW IF NOT EXISTS {raw_table_name(kind)} AS SELECT {', '.join(columns)} "
            f"FROM {within}{message_table_name(kind)} ARRAY JOIN {', '.join(joined)}")
    return statements


def _array_type(name: str, dtype: object) -> str:
    """The raw tables' column type of a field, as an array with the same codec (times as
    milliseconds, delta-coded; optional values as NaN or null elements)."""
    if name == "event_time_ms":
        return "Array(Int64) CODEC(DoubleDelta, ZSTD(1))"
    base, _, codec = sample_column_type(name, dtype).partition(" CODEC")
    if base.startswith("Nullable("):
        base = base[len("Nullable("):-1]
    if base == "LowCardinality(String)":
        base = "LowCardinality(Nullable(String))"
    return f"Array({base})" + (f" CODEC{codec}" if codec else "")


def _array_name(field: str) -> str:
    """A per-sample field's array column (``gpu_uuid`` is the message's own column)."""
    return {"event_time_ms": "times_ms", "gpu_uuid": "gpu_uuids"}.get(field, field)


def message_tables(batches: Sequence[DecodedBatch]) -> dict[str, pa.Table]:
    """One Arrow table per sample kind held by ``batches``: a row per message that has
    samples of that kind, its fields as lists of the message's samples."""
    out = {}
    for kind, fields in FIELD_DTYPES.items():
        rows = [(b.header, b.frames[kind]) for b in batches
                if kind in b.frames and b.frames[kind]["event_time_ms"].size]
        if not rows:
            continue
        sizes = np.fromiter((frame["event_time_ms"].size for _, frame in rows), np.int64,
                            len(rows))
        offsets = pa.array(np.concatenate(([0], np.cumsum(sizes))).astype(np.int32))
        headers = [header for header, _ in rows]
        arrays: dict[str, pa.Array] = {
            "event_time": pa.array([int(frame["event_time_ms"][0]) for _, frame in rows],
                                   type=pa.timestamp("ms", tz="UTC")),
            "job_id": pa.array([h.identity.job_id for h in headers]),
            "node_id": pa.array([h.identity.node_id for h in headers]),
            "worker_id": pa.array([h.identity.worker_id for h in headers]),
            "message_id": pa.array([h.event_id for h in headers]),
        }
        if "gpu_uuid" not in fields:
            arrays["gpu_uuid"] = pa.array([h.gpu_uuid or "" for h in headers])
        for name, dtype in fields.items():
            column = np.concatenate([frame[name] for _, frame in rows])
            # floats keep NaN for a missing value: the arrays' elements are not nullable
            values = pa.array(column, type=pa.string()) if dtype is object else pa.array(column)
            arrays[_array_name(name)] = pa.ListArray.from_arrays(offsets, values)
        out[message_table_name(kind)] = pa.table(arrays)
    return out


def _per_sample_tables(batches: Sequence[DecodedBatch]) -> dict[str, pa.Table]:
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
        "per_sample": _per_sample_tables, "per_message": message_tables}
    statements = {"per_sample": [s for s in raw_table_statements(30)
                                 if s.startswith("CREATE TABLE")],
                  "per_message": [*message_table_statements(30),
                                  *sample_view_statements("per_message")]}
    with tempfile.TemporaryDirectory(dir=work) as store:
        client = connect(f"chdb://{store}")
        for layout in LAYOUTS:
            client.command(f"CREATE DATABASE IF NOT EXISTS {layout}")
            for statement in statements[layout]:
                client.command(statement.replace("EXISTS ", f"EXISTS {layout}.", 1))
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

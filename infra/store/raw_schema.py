"""The raw samples' tables: one row per probe message and sample kind, and per kind a view
with one row per sample, named as the kind's table was when it held a row per sample.

A message row holds the message's identity once and each field's samples as an array under
the field's codec (a missing float as NaN); its ``event_time`` is its earliest sample's. The
view gives every sample its own ``event_time`` and its place among its message's samples of
its kind (``seq``, from 0), reads NaN as NULL, and also reads a store's older per-sample
table (renamed ``raw_<kind>_per_sample``) until its TTL has emptied it.
"""

from __future__ import annotations

import logging

import numpy as np
from clickhouse_connect.driver.client import Client

from dsec.infra.store.raw_columns import (
    IDENTITY_COLUMNS,
    array_column_name,
    raw_message_table_name,
    raw_table_name,
)
from dsec.schemas.frames import FIELD_DTYPES

log = logging.getLogger(__name__)

_TIME_CODEC = "CODEC(DoubleDelta, ZSTD(1))"  # a worker's samples, in time order
_CLIMBING = ("step", "episode_index")  # climb by small steps within a worker's rows
_LABEL_FIELDS = ("termination_reason", "gpu_model", "op", "source", "timer", "error",
                 "runtime_type", "grad_norm_source")
# A message's samples are kept, and expire, with its first sample's day: the store refuses a
# message whose samples span more than a day (a broken clock), and the sink dead-letters it.
MAX_MESSAGE_SPAN_MS = 86_400_000
_ELEMENT_DEFAULT = {np.int64: "0", np.float64: "nan", np.bool_: "false"}


def legacy_table_name(kind: str) -> str:
    """Where an older store's per-sample table of ``kind`` is kept, read by the view."""
    return f"raw_{kind}_per_sample"


def sample_column_type(name: str, dtype: object) -> str:
    """A sample field's per-sample column type and codec: counters that climb by delta,
    other integers by T64, measured values by ZSTD (on noisy floats it packs tighter than
    Gorilla), all before ZSTD; labels as dictionaries."""
    if dtype is np.int64:
        first = "Delta" if name in _CLIMBING else "T64"
        return f"Int64 CODEC({first}, ZSTD(1))"
    if dtype is np.float64:
        return "Nullable(Float64) CODEC(ZSTD(3))"
    if dtype is np.bool_:
        return "Bool"
    return "LowCardinality(String)"


def array_column_type(name: str, dtype: object) -> str:
    """A sample field's array column: the per-sample type and codec on the array's
    elements, floats not nullable (NaN). A column added to a store with rows gives those
    rows one default element per sample."""
    if name == "event_time_ms":
        return f"Array(Int64) {_TIME_CODEC}"
    base, _, codec = sample_column_type(name, dtype).partition(" CODEC")
    base = base.removeprefix("Nullable(").removesuffix(")") if dtype is np.float64 else base
    default = _ELEMENT_DEFAULT.get(dtype, "''")
    return (f"Array({base}) DEFAULT arrayWithConstant(length(times_ms), {default})"
            + (f" CODEC{codec}" if codec else ""))


def message_table_statement(kind: str, ttl_days: int) -> str:
    fields = FIELD_DTYPES[kind]
    columns = [f"event_time DateTime64(3, 'UTC') {_TIME_CODEC}",
               *(f"{name} LowCardinality(String)" for name in IDENTITY_COLUMNS)]
    if "gpu_uuid" not in fields:
        columns.append("gpu_uuid LowCardinality(String)")
    columns += [f"{array_column_name(name)} {array_column_type(name, dtype)}"
                for name, dtype in fields.items()]
    columns.append(f"ingest_time DateTime64(3, 'UTC') DEFAULT now64(3) {_TIME_CODEC}")
    columns.append(f"CONSTRAINT samples_within_a_day CHECK "
                   f"arrayMax(times_ms) - arrayMin(times_ms) <= {MAX_MESSAGE_SPAN_MS}")
    return (f"CREATE TABLE IF NOT EXISTS {raw_message_table_name(kind)} ({', '.join(columns)}) "
            "ENGINE = MergeTree PARTITION BY toDate(event_time) "
            "ORDER BY (job_id, worker_id, event_time) "
            f"TTL toDateTime(event_time) + INTERVAL {int(ttl_days)} DAY "
            "SETTINGS non_replicated_deduplication_window = 10000")


def sample_view_statement(kind: str, legacy: bool = False) -> str:
    """The per-sample view of ``kind``; ``legacy``: it also reads the older per-sample
    table. ``message_time`` is the sample's message's ``event_time``: a filter on it skips
    the parts outside it (see ``since_filter``), one on ``event_time`` alone reads them."""
    fields = FIELD_DTYPES[kind]
    joined = ["times_ms AS sample_time_ms", "arrayEnumerate(times_ms) AS sample_number"]
    columns = ["fromUnixTimestamp64Milli(sample_time_ms, 'UTC') AS event_time",
               "toUInt32(sample_number - 1) AS seq", *IDENTITY_COLUMNS]
    names = ["event_time", "seq", *IDENTITY_COLUMNS]
    if "gpu_uuid" not in fields:
        columns.append("gpu_uuid")
        names.append("gpu_uuid")
    for name, dtype in fields.items():
        if name == "event_time_ms":
            continue
        names.append(name)
        array = array_column_name(name)
        if dtype is np.float64:  # a missing value is NaN in the array, NULL in the view
            joined.append(f"{raw_message_table_name(kind)}.{array} AS {name}_element")
            columns.append(f"if(isNaN({name}_element), NULL, {name}_element) AS {name}")
        else:
            joined.append(name if array == name else f"{array} AS {name}")
            columns.append(name)
    columns += ["ingest_time", f"{raw_message_table_name(kind)}.event_time AS message_time"]
    names += ["ingest_time", "event_time AS message_time"]
    select = (f"SELECT {', '.join(columns)} FROM {raw_message_table_name(kind)} "
              f"ARRAY JOIN {', '.join(joined)}")
    if legacy:
        select += f" UNION ALL SELECT {', '.join(names)} FROM {legacy_table_name(kind)}"
    return f"CREATE OR REPLACE VIEW {raw_table_name(kind)} AS {select}"


def raw_metrics_view_statement() -> str:
    """Every kind's samples in one view: numbers as a map of floats, labels as strings."""
    selects = []
    for kind, fields in FIELD_DTYPES.items():
        numbers = [name for name, dtype in fields.items()
                   if dtype is not object and name not in ("event_time_ms", "step")]
        labels = [name for name in _LABEL_FIELDS if name in fields]
        step = "step" if "step" in fields else (
            "episode_index" if "episode_index" in fields else "toInt64(0)")
        values = ", ".join(f"'{n}', ifNull(toFloat64({n}), nan)" for n in numbers)
        label_pairs = ", ".join(f"'{n}', ifNull({n}, '')" for n in labels)
        selects.append(
            f"SELECT event_time, seq, job_id, node_id, worker_id, "
            f"toString(gpu_uuid) AS gpu_uuid, '{kind}' AS kind, toInt64({step}) AS step, "
            f"CAST(map({values}), 'Map(String, Float64)') AS values, "
            f"CAST(map({label_pairs}), 'Map(String, String)') AS labels, ingest_time, "
            f"message_time "
            f"FROM {raw_table_name(kind)}"
        )
    return "CREATE OR REPLACE VIEW raw_metrics AS " + " UNION ALL ".join(selects)


def since_filter(since_ms_sql: str) -> str:
    """A per-sample view's rows from ``since_ms_sql`` (a SQL expression of epoch
    milliseconds) on: on the sample's time, and on its message's time, which lets the
    store skip the parts before it (a message's samples span at most a day)."""
    return (f"event_time >= fromUnixTimestamp64Milli({since_ms_sql}) AND message_time >= "
            f"fromUnixTimestamp64Milli({since_ms_sql} - {MAX_MESSAGE_SPAN_MS})")


def _engines(client: Client) -> dict[str, str]:
    return dict(client.query("SELECT name, engine FROM system.tables "
                             "WHERE database = currentDatabase()").result_rows)


def _keep_per_sample_tables(client: Client) -> None:
    """An older store's per-sample tables are renamed out of their views' way."""
    for kind in FIELD_DTYPES:
        table = raw_table_name(kind)
        if _engines(client).get(table, "View") == "View":
            continue
        log.warning("store: %s holds a row per sample; kept as %s and read by the view %s",
                    table, legacy_table_name(kind), table)
        try:
            client.command(f"RENAME TABLE {table} TO {legacy_table_name(kind)}")
        except Exception:
            if _engines(client).get(table, "View") != "View":  # not renamed by another process
                raise


def _add_missing_columns(client: Client) -> None:
    """A field added to a sample kind since the store was made gets its column."""
    existing = {(table, name) for table, name in client.query(
        "SELECT table, name FROM system.columns WHERE database = currentDatabase()"
    ).result_rows}
    tables = {table for table, _ in existing}
    for kind, fields in FIELD_DTYPES.items():
        messages, legacy = raw_message_table_name(kind), legacy_table_name(kind)
        for name, dtype in fields.items():
            array = array_column_name(name)
            if (messages, array) not in existing:
                client.command(f"ALTER TABLE {messages} ADD COLUMN IF NOT EXISTS {array} "
                               f"{array_column_type(name, dtype)}")
            if legacy in tables and name != "event_time_ms" and (legacy, name) not in existing:
                client.command(f"ALTER TABLE {legacy} ADD COLUMN IF NOT EXISTS {name} "
                               f"{sample_column_type(name, dtype)}")


def ensure_raw_schema(client: Client, ttl_days: int) -> None:
    """The message tables, older per-sample tables kept, columns added, then the views."""
    _keep_per_sample_tables(client)
    for kind in FIELD_DTYPES:
        client.command(message_table_statement(kind, ttl_days))
    _add_missing_columns(client)
    tables = _engines(client)
    for kind in FIELD_DTYPES:
        client.command(sample_view_statement(kind, legacy=legacy_table_name(kind) in tables))
    client.command(raw_metrics_view_statement())

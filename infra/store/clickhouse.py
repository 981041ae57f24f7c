"""The ClickHouse store: one code path (the clickhouse-connect Client) for the embedded
chDB engine (``chdb:///dir``) and for a ClickHouse server (``http(s)://…``)."""

from __future__ import annotations

import fcntl
import logging
import re
import time
from importlib import resources
from pathlib import Path

import clickhouse_connect
import numpy as np
from clickhouse_connect.driver.client import Client

from dsec.infra.store.raw_columns import raw_table_name
from dsec.schemas.frames import FIELD_DTYPES

log = logging.getLogger(__name__)

TABLES = (
    "features",
    "gpu_profiles",
    "actuations",
    "actuation_results",
    "policy_decisions",
    "dead_letters",
    "sink_offsets",
    "alerts",
    "gpu_health",
    "process_usage",
    "gpu_personalities",
    "workload_affinity",
    "gpu_topology",
)
RAW_TABLES = tuple(raw_table_name(kind) for kind in FIELD_DTYPES)
_TIME_CODEC = "CODEC(DoubleDelta, ZSTD(1))"  # a worker's samples, in time order
_CLIMBING = ("step", "episode_index")  # climb by small steps within a worker's rows
_LABEL_FIELDS = ("termination_reason", "gpu_model", "op", "source", "timer", "error",
                 "runtime_type", "grad_norm_source")


class StoreLockedError(RuntimeError):
    """The embedded store is held by another process (a running ``dsec up``)."""


def connect(dsn: str, wait_for_lock_s: float = 0.0) -> Client:
    """A client of ``dsn``. The embedded store is held by one process at a time: when
    another holds it, this waits up to ``wait_for_lock_s`` for it to let go (a sink that is
    still stopping as its successor starts), then raises ``StoreLockedError``."""
    if not dsn.startswith("chdb://"):
        return clickhouse_connect.get_client(dsn=dsn)
    if wait_for_lock_s > 0:
        # Before opening: a failed open leaves chDB unable to open again in this process.
        _wait_until_unlocked(Path(dsn.removeprefix("chdb://")) / "status", wait_for_lock_s)
    return _connect_embedded(dsn)


def store_locked(status_file: Path) -> bool:
    """True while a ClickHouse engine holds the store whose status file this is (it keeps
    an exclusive ``flock`` on it, and removes it when it closes)."""
    try:
        with status_file.open("rb") as status:
            try:
                fcntl.flock(status, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(status, fcntl.LOCK_UN)
            return False
    except FileNotFoundError:
        return False


def _wait_until_unlocked(status_file: Path, wait_s: float) -> None:
    deadline_s = time.monotonic() + wait_s
    if not store_locked(status_file):
        return
    log.warning("%s is held by another process; waiting up to %.0f s for it",
                status_file.parent, wait_s)
    while store_locked(status_file) and time.monotonic() < deadline_s:
        time.sleep(0.25)


def _connect_embedded(dsn: str) -> Client:
    try:
        return clickhouse_connect.get_client(dsn=dsn)
    except Exception as exc:
        if "Cannot lock file" in str(exc) or "Another server instance" in str(exc):
            raise StoreLockedError(
                f"{dsn} is open in another process (is `dsec up` running?)"
            ) from exc
        raise


def schema_statements(ttl_days: int) -> list[str]:
    text = resources.files("dsec.infra.store").joinpath("schema.sql").read_text()
    text = re.sub(r"--[^\n]*", "", text).replace("{ttl_days}", str(int(ttl_days)))
    return [statement.strip() for statement in text.split(";") if statement.strip()]


def sample_column_type(name: str, dtype: object) -> str:
    """A sample field's column type and codec: counters that climb by delta, other
    integers by T64, measured values by ZSTD (on noisy floats it packs tighter than
    Gorilla), all before ZSTD; labels as dictionaries."""
    if dtype is np.int64:
        first = "Delta" if name in _CLIMBING else "T64"
        return f"Int64 CODEC({first}, ZSTD(1))"
    if dtype is np.float64:
        return "Nullable(Float64) CODEC(ZSTD(3))"
    if dtype is np.bool_:
        return "Bool"
    return "LowCardinality(String)"


def raw_table_statements(ttl_days: int) -> list[str]:
    """One table per sample kind, columns as the schemas say, and the raw_metrics view."""
    statements, selects = [], []
    for kind, fields in FIELD_DTYPES.items():
        columns = [
            f"event_time DateTime64(3, 'UTC') {_TIME_CODEC}",
            "seq UInt32 CODEC(T64, ZSTD(1))",
            "job_id LowCardinality(String)", "node_id LowCardinality(String)",
            "worker_id LowCardinality(String)",
        ]
        if "gpu_uuid" not in fields:
            columns.append("gpu_uuid LowCardinality(String)")
        columns += [
            f"{name} {sample_column_type(name, dtype)}"
            for name, dtype in fields.items() if name != "event_time_ms"
        ]
        columns.append(f"ingest_time DateTime64(3, 'UTC') DEFAULT now64(3) {_TIME_CODEC}")
        table = raw_table_name(kind)
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(columns)}) ENGINE = MergeTree "
            "PARTITION BY toDate(event_time) ORDER BY (job_id, worker_id, event_time) "
            f"TTL toDateTime(event_time) + INTERVAL {int(ttl_days)} DAY "
            "SETTINGS non_replicated_deduplication_window = 10000"
        )
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
            f"CAST(map({label_pairs}), 'Map(String, String)') AS labels, ingest_time "
            f"FROM {table}"
        )
    statements.append("CREATE OR REPLACE VIEW raw_metrics AS " + " UNION ALL ".join(selects))
    return statements


def _add_missing_raw_columns(client: Client) -> None:
    """A field added to a sample kind since the store was made gets its column."""
    existing = {(table, name) for table, name in client.query(
        "SELECT table, name FROM system.columns WHERE database = currentDatabase()"
    ).result_rows}
    for kind, fields in FIELD_DTYPES.items():
        table = raw_table_name(kind)
        for name, dtype in fields.items():
            if name != "event_time_ms" and (table, name) not in existing:
                client.command(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} "
                               f"{sample_column_type(name, dtype)}")


def ensure_schema(client: Client, ttl_days: int = 30) -> None:
    """Creates the history tables if they are missing; safe to run at every start."""
    *tables, view = schema_statements(ttl_days) + raw_table_statements(ttl_days)
    for statement in tables:
        client.command(statement)
    _add_missing_raw_columns(client)
    client.command(view)  # the raw_metrics view over every column, the added ones too

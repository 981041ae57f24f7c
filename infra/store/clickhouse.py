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
from clickhouse_connect.driver.client import Client

from dsec.infra.store.raw_columns import raw_message_table_name, raw_table_name
from dsec.infra.store.raw_schema import ensure_raw_schema
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
RAW_TABLES = tuple(raw_table_name(kind) for kind in FIELD_DTYPES)  # per-sample views
RAW_MESSAGE_TABLES = tuple(raw_message_table_name(kind) for kind in FIELD_DTYPES)


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


def ensure_schema(client: Client, ttl_days: int = 30) -> None:
    """Creates the history tables if they are missing; safe to run at every start."""
    for statement in schema_statements(ttl_days):
        client.command(statement)
    ensure_raw_schema(client, ttl_days)

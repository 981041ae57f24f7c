"""The ClickHouse store: one code path (the clickhouse-connect Client) for the embedded
chDB engine (``chdb:///dir``) and for a ClickHouse server (``http(s)://…``)."""

from __future__ import annotations

import re
from importlib import resources

import clickhouse_connect
from clickhouse_connect.driver.client import Client

TABLES = (
    "raw_metrics",
    "features",
    "actuations",
    "actuation_results",
    "policy_decisions",
    "dead_letters",
)


class StoreLockedError(RuntimeError):
    """The embedded store is held by another process (a running ``dsec up``)."""


def connect(dsn: str) -> Client:
    if dsn.startswith("chdb://"):
        try:
            return clickhouse_connect.get_client(dsn=dsn)
        except Exception as exc:
            if "Cannot lock file" in str(exc) or "Another server instance" in str(exc):
                raise StoreLockedError(
                    f"{dsn} is open in another process (is `dsec up` running?)"
                ) from exc
            raise
    return clickhouse_connect.get_client(dsn=dsn)


def schema_statements(ttl_days: int) -> list[str]:
    text = resources.files("dsec.infra").joinpath("clickhouse", "schema.sql").read_text()
    text = re.sub(r"--[^\n]*", "", text).replace("{ttl_days}", str(int(ttl_days)))
    return [statement.strip() for statement in text.split(";") if statement.strip()]


def ensure_schema(client: Client, ttl_days: int = 30) -> None:
    """Creates the history tables if they are missing; safe to run at every start."""
    for statement in schema_statements(ttl_days):
        client.command(statement)

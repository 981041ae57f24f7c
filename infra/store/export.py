"""Stored raw samples back out as JSON lines of columnar ``MetricBatch``es — the format
``dsec replay`` reads."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import orjson

from dsec.infra.store.raw_columns import raw_table_name
from dsec.infra.store.raw_schema import since_filter
from dsec.schemas.frames import FIELD_DTYPES
from dsec.schemas.metrics import SAMPLE_MODELS

Query = Callable[[str, dict], dict]  # (sql, parameters) -> {"columns": [...], "rows": [...]}


def _unset_labels(kind: str) -> frozenset[str]:
    """Optional labels of a sample kind: a store keeps one never set as '', the wire as null."""
    fields = SAMPLE_MODELS[kind].model_fields
    return frozenset(name for name, dtype in FIELD_DTYPES[kind].items()
                     if dtype is object and fields[name].default is None)


def _batch_id(kind: str, identity: tuple[str, str, str], event_ms: int, seq: int) -> str:
    """The same id for the same stored run of samples, so that replaying an export twice
    stores it once."""
    key = "\x00".join([kind, *identity, str(event_ms), str(seq)]).encode()
    return hashlib.blake2b(key, digest_size=16).hexdigest()


def export_batches(query: Query, since_ms: int, job_id: str | None = None) -> Iterator[bytes]:
    """One line per stored run of a worker's samples of one kind (its message's samples of
    that kind, numbered by ``seq`` from 0), oldest first."""
    batches: list[dict] = []
    for kind, fields in FIELD_DTYPES.items():
        names = [name for name in fields if name != "event_time_ms"]
        unset = _unset_labels(kind)
        sql = (
            f"SELECT job_id, node_id, worker_id, toUnixTimestamp64Milli(event_time) AS t, seq, "
            f"{', '.join(names)} FROM {raw_table_name(kind)} "
            f"WHERE {since_filter('{since:Int64}')}"
            + (" AND job_id = {job:String}" if job_id else "")
            + " ORDER BY job_id, worker_id, node_id, event_time, seq"
        )
        result = query(sql, {"since": since_ms, "job": job_id or ""})
        batch: dict | None = None
        last: tuple[tuple[str, str, str], int] | None = None
        for row in result["rows"]:
            job, node, worker, event_ms, seq, *values = row
            identity, event_ms, seq = (job, node, worker), int(event_ms), int(seq)
            if batch is None or seq == 0 or last != (identity, seq - 1):
                batch = {
                    "event_id": _batch_id(kind, identity, event_ms, seq),
                    "event_time_ms": event_ms,
                    "identity": {"job_id": job, "node_id": node, "worker_id": worker},
                    "columns": {kind: {"event_time_ms": [], **{name: [] for name in names}}},
                }
                batches.append(batch)
            last = (identity, seq)
            batch["event_time_ms"] = max(batch["event_time_ms"], event_ms)
            columns = batch["columns"][kind]
            columns["event_time_ms"].append(event_ms)
            for name, value in zip(names, values, strict=True):
                columns[name].append(None if value == "" and name in unset else value)
    for batch in sorted(batches, key=lambda b: (b["event_time_ms"], b["event_id"])):
        yield orjson.dumps(batch)

"""Stored raw samples back out as JSON lines of columnar ``MetricBatch``es — the format
``dsec replay`` reads."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import orjson

from dsec.infra.store.raw_columns import raw_table_name
from dsec.schemas.frames import FIELD_DTYPES
from dsec.schemas.metrics import SAMPLE_MODELS

Query = Callable[[str, dict], dict]  # (sql, parameters) -> {"columns": [...], "rows": [...]}


def _unset_labels(kind: str) -> frozenset[str]:
    """Optional labels of a sample kind: a store keeps one never set as '', the wire as null."""
    fields = SAMPLE_MODELS[kind].model_fields
    return frozenset(name for name, dtype in FIELD_DTYPES[kind].items()
                     if dtype is object and fields[name].default is None)


def export_batches(query: Query, since_ms: int, job_id: str | None = None) -> Iterator[bytes]:
    """One line per stored batch, oldest first, with the samples of every kind it held."""
    batches: dict[str, dict] = {}
    for kind, fields in FIELD_DTYPES.items():
        names = [name for name in fields if name != "event_time_ms"]
        unset = _unset_labels(kind)
        sql = (
            f"SELECT batch_id, job_id, node_id, worker_id, toUnixTimestamp64Milli(event_time) "
            f"AS t, {', '.join(names)} FROM {raw_table_name(kind)} "
            "WHERE event_time >= fromUnixTimestamp64Milli({since:Int64})"
            + (" AND job_id = {job:String}" if job_id else "")
            + " ORDER BY event_time, batch_id, seq"
        )
        result = query(sql, {"since": since_ms, "job": job_id or ""})
        for row in result["rows"]:
            batch_id, job, node, worker, event_ms, *values = row
            batch = batches.setdefault(batch_id, {
                "event_id": batch_id, "event_time_ms": int(event_ms),
                "identity": {"job_id": job, "node_id": node, "worker_id": worker},
                "columns": {},
            })
            batch["event_time_ms"] = max(batch["event_time_ms"], int(event_ms))
            columns = batch["columns"].setdefault(
                kind, {"event_time_ms": [], **{name: [] for name in names}})
            columns["event_time_ms"].append(int(event_ms))
            for name, value in zip(names, values, strict=True):
                columns[name].append(None if value == "" and name in unset else value)
    for batch in sorted(batches.values(), key=lambda b: (b["event_time_ms"], b["event_id"])):
        yield orjson.dumps(batch)

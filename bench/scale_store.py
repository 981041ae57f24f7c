"""The store at fleet scale: a generated history written straight into ClickHouse (by
``INSERT … SELECT … FROM numbers()``, so the generator costs nothing in Python), then
bytes on disk per stored sample from ``system.parts`` after merges, and the latency of
every ready analysis query (``infra/queries/``) and of every Grafana history panel over it.

Raw samples are generated a row per sample into staging tables, then packed into the
store's message tables, one message per worker and second as the probe sends them.

The generated values: each worker's samples in time order at the probe's rates, counters
that climb, NVML readings in whole units (memory in whole MiB), the heartbeat's interval
as configured, and every other measured value a hash-drawn
number with three decimals between 0 and 100 (about 17 bits of noise, which no codec
removes: real losses and latencies carry at least as much).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsec.bench.scale_fleet import ProbeRates
from dsec.bench.store_layout import per_sample_statements
from dsec.infra.store.raw_columns import array_column_name, raw_message_table_name
from dsec.schemas.features import WORKER_FEATURES
from dsec.schemas.frames import FIELD_DTYPES

QUERIES = Path(__file__).resolve().parent.parent / "infra" / "queries"
DASHBOARDS = Path(__file__).resolve().parent.parent / "infra" / "grafana" / "dashboards"
START_S = 1_800_000_000
JOBS = 4

# name -> a ClickHouse expression of the row's worker (w) and its time index (i)
_BY_NAME = {
    "worker_id": "concat('w', toString(w))",
    "node_id": "concat('n', toString(intDiv(w, 8)))",
    "gpu_uuid": "concat('GPU-', leftPad(toString(w), 8, '0'))",
    "gpu_model": "if(w % 3 = 0, 'NVIDIA A100', 'NVIDIA H100')",
    "job_id": f"concat('job-', toString(w % {JOBS}))",
    "pool": "if(w % 2 = 0, 'a', 'b')",
    "regime": "if(i % 2 = 0, 'short', 'long')",
    "window": "'episodes'",
    "decision": "['fired', 'resolved', 'suppressed'][1 + i % 3]",
    "status": "['applied', 'failed', 'unsupported', 'deferred'][1 + i % 4]",
    "action": "['snapshot', 'precision', 'memory_cap'][1 + i % 3]",
    "policy_name": "['gpu-memory-leak', 'grad-sync-breaker', 'nan-guard'][1 + i % 3]",
    "step": "i", "episode_index": "i", "seq": "toUInt32(i % 16)",
    "memory_used_bytes": "toInt64(40 * 1073741824 + (i % 3600) * 1048576)",
    "memory_total_bytes": "toInt64(85899345920)",
    # NVML's per-process figure: whole MiB, rising slowly like the card's
    "process_memory_used_bytes": "toFloat64(30 * 1073741824 + (i % 3600) * 1048576)",
    "interval_s": f"toFloat64({ProbeRates().heartbeat_every_s})",  # the probe's setting
    "bytes": "toInt64(16777216)", "length": "toInt64(200 + i % 37)",
    # NVML answers in whole units: percent, degrees, MHz, milliwatts
    "utilisation_pct": "toFloat64(cityHash64(number) % 101)",
    "temperature_c": "toFloat64(45 + cityHash64(number) % 40)",
    "sm_clock_mhz": "toFloat64(1980 - 15 * (cityHash64(number) % 8))",
    "power_w": "(250000 + cityHash64(number) % 400000) / 1000",
}


@dataclass(frozen=True)
class StoreScale:
    """The generated history: ``gpus`` workers (one per GPU) over ``hours`` hours, at the
    probe's rates, one feature event a second per worker with every catalogue feature."""

    gpus: int = 100
    hours: float = 24.0
    rates: ProbeRates = field(default_factory=ProbeRates)

    @property
    def seconds(self) -> int:
        return int(self.hours * 3600)

    def raw_rows(self) -> dict[str, int]:
        """Samples per raw (per-sample) view."""
        r, s, n = self.rates, self.seconds, self.gpus
        return {"raw_step": r.steps_per_s * s * n, "raw_grad_sync": r.grad_syncs_per_s * s * n,
                "raw_gpu": r.gpu_samples_per_s * s * n,
                "raw_episode": s // r.episode_every_s * n,
                "raw_heartbeat": s // r.heartbeat_every_s * n}

    def history_rows(self) -> dict[str, int]:
        s, n = self.seconds, self.gpus
        return {"features": s * n * len(WORKER_FEATURES), "gpu_profiles": s // 10 * n,
                "actuations": s // 60 * n, "actuation_results": s // 60 * n,
                "policy_decisions": s // 20 * n, "dead_letters": s // 600 * n}


def _expression(name: str, column_type: str, table: str, per_worker_s: float) -> str | None:
    if name == "ingest_time" or column_type.startswith("AggregateFunction"):
        return None
    if name == "feature":
        names = ", ".join(f"'{feature}'" for feature in WORKER_FEATURES)
        return f"[{names}][1 + number % {len(WORKER_FEATURES)}]"
    if "DateTime" in column_type:
        precision = "3" if "DateTime64" in column_type else None
        seconds = f"{START_S} + toUInt64(i * {per_worker_s})"
        value = (f"toDateTime64({seconds} + (w % 1000) / 1000, 3, 'UTC')" if precision
                 else f"toDateTime({seconds}, 'UTC')")
        return f"toNullable({value})" if column_type.startswith("Nullable") else value
    if name in _BY_NAME:
        return _BY_NAME[name]
    if "Float" in column_type:
        return "round((cityHash64(number) % 100000) / 1000.0, 3)"
    if "Int" in column_type:
        return "toUInt32(cityHash64(number) % 4)" if "UInt" in column_type else "toInt64(0)"
    if "Bool" in column_type:
        return "number % 997 = 0"
    if "String" in column_type:
        return "toString(number)" if name.endswith("_id") else "''"
    return None


def generate(client, table: str, rows: int, workers: int, per_worker_s: float) -> float:
    """Writes ``rows`` rows into ``table``: row k belongs to worker k mod ``workers`` and
    time index k / ``workers`` (feature rows share their event's time); seconds taken."""
    columns = client.query(
        "SELECT name, type FROM system.columns WHERE database = currentDatabase() "
        f"AND table = '{table}' ORDER BY position").result_rows
    per_event = len(WORKER_FEATURES) if table == "features" else 1
    names, expressions = [], []
    for name, column_type in columns:
        expression = _expression(name, column_type, table, per_worker_s)
        if expression is not None:
            names.append(name)
            expressions.append(f"{expression} AS {name}")
    start = time.perf_counter()
    client.command(
        f"INSERT INTO {table} ({', '.join(names)}) SELECT {', '.join(expressions)} FROM "
        f"(SELECT number, intDiv(number, {per_event}) % {workers} AS w, "
        f"intDiv(number, {per_event * workers}) AS i FROM numbers({rows}))",
        settings={"max_partitions_per_insert_block": 1000})
    return time.perf_counter() - start


def bytes_on_disk(client, tables: list[str]) -> dict[str, dict[str, float]]:
    """Per table after ``OPTIMIZE … FINAL``: rows, bytes on disk, bytes per row."""
    out = {}
    for table in tables:
        client.command(f"OPTIMIZE TABLE {table} FINAL")
        rows, size = client.query(
            "SELECT sum(rows), sum(bytes_on_disk) FROM system.parts WHERE active "
            f"AND database = currentDatabase() AND table = '{table}'").result_rows[0]
        out[table] = {"rows": int(rows), "bytes_on_disk": int(size),
                      "bytes_per_row": round(size / rows, 2) if rows else None}
    return out


def _timed(client, sql: str) -> float:
    start = time.perf_counter()
    client.query(sql)
    return time.perf_counter() - start


def median_s(client, sql: str) -> float:
    """The median of three runs of ``sql``, in seconds."""
    return round(sorted(_timed(client, sql) for _ in range(3))[1], 4)


def grafana_sql(sql: str, since_s: int, until_s: int) -> str:
    """A dashboard panel's query as the ClickHouse data source sends it, for the whole
    generated range and every job."""
    sql = re.sub(r"\$__conditionalAll\((.*?),\s*\$job\)", "1=1", sql, flags=re.S)
    sql = re.sub(r"\$__timeFilter\(([^)]+)\)",
                 rf"\1 >= toDateTime({since_s}) AND \1 <= toDateTime({until_s})", sql)
    return re.sub(r"\$__timeInterval\(([^)]+)\)",
                  r"toStartOfInterval(toDateTime(\1), INTERVAL 60 second)", sql)


def query_latencies_s(client, scale: StoreScale) -> dict[str, dict[str, float]]:
    """The median of three runs of each ready query and history panel."""
    ready = {path.stem: median_s(client, path.read_text())
             for path in sorted(QUERIES.glob("*.sql"))}
    panels = {}
    until_s = START_S + scale.seconds + 60
    for panel in json.loads((DASHBOARDS / "history.json").read_text())["panels"]:
        for target in panel.get("targets", []):
            panels[panel["title"]] = median_s(
                client, grafana_sql(target["rawSql"], START_S, until_s))
    return {"ready_queries_s": ready, "history_panels_s": panels}


def pack_messages(client, view: str) -> float:
    """Moves the per-sample rows of the staging table ``stage_<view>`` into the view's message
    table, one row per worker and second (the probe's messages, as ``worker_second``), then
    drops the staging table; seconds taken."""
    kind = view.removeprefix("raw_")
    fields = [name for name in FIELD_DTYPES[kind] if name != "event_time_ms"]
    per_message = "gpu_uuid" not in FIELD_DTYPES[kind]
    elements = ", ".join(f"ifNull({name}, nan)" if FIELD_DTYPES[kind][name] is np.float64
                         else name for name in fields)
    arrays = ", ".join(f"arrayMap(x -> x.{n + 2}, s)" for n in range(len(fields)))
    start = time.perf_counter()
    client.command(
        f"INSERT INTO {raw_message_table_name(kind)} (event_time, job_id, node_id, worker_id, "
        f"{'gpu_uuid, ' if per_message else ''}times_ms, "
        f"{', '.join(array_column_name(name) for name in fields)}) "
        f"SELECT first_time, job_id, node_id, worker_id, {'gpu, ' if per_message else ''}"
        f"arrayMap(x -> x.1, s), {arrays} FROM (SELECT min(event_time) AS first_time, "
        f"job_id, node_id, worker_id, {'any(gpu_uuid) AS gpu, ' if per_message else ''}"
        "arraySort(x -> x.1, groupArray(tuple(toUnixTimestamp64Milli(event_time), "
        f"{elements}))) AS s FROM stage_{view} "
        "GROUP BY job_id, node_id, worker_id, toStartOfSecond(event_time))",
        settings={"max_partitions_per_insert_block": 1000})
    client.command(f"DROP TABLE stage_{view}")
    return time.perf_counter() - start


def bytes_per_sample(client, views: list[str]) -> dict[str, dict[str, float]]:
    """Per raw view after ``OPTIMIZE … FINAL`` of its message table: samples, message rows,
    bytes on disk, bytes per sample."""
    out = {}
    for view in views:
        table = raw_message_table_name(view.removeprefix("raw_"))
        client.command(f"OPTIMIZE TABLE {table} FINAL")
        messages, size = client.query(
            "SELECT sum(rows), sum(bytes_on_disk) FROM system.parts WHERE active "
            f"AND database = currentDatabase() AND table = '{table}'").result_rows[0]
        samples = client.query(f"SELECT count() FROM {view}").result_rows[0][0]
        out[view] = {"samples": int(samples), "message_rows": int(messages),
                     "bytes_on_disk": int(size),
                     "bytes_per_sample": round(size / samples, 2) if samples else None}
    return out


def measure_store(client, scale: StoreScale) -> dict:
    """Generates the history in an empty store and measures it: raw samples into staging
    tables of one row per sample, packed into the store's message tables."""
    raw, history = scale.raw_rows(), scale.history_rows()
    for view in raw:
        [statement] = [s for s in per_sample_statements() if f" {view} (" in s]
        client.command(statement.replace(f" {view} (", f" stage_{view} (", 1))
    generate_s = {}
    for table, rows in {**raw, **history}.items():
        per_event = len(WORKER_FEATURES) if table == "features" else 1
        per_worker_s = scale.seconds / max(1, rows // per_event // scale.gpus)
        target = f"stage_{table}" if table in raw else table
        generate_s[table] = generate(client, target, rows, scale.gpus, per_worker_s)
        if table in raw:
            generate_s[table] += pack_messages(client, table)
        generate_s[table] = round(generate_s[table], 2)
    disk = bytes_per_sample(client, list(raw))
    samples = sum(entry["samples"] for entry in disk.values())
    return {
        "gpus": scale.gpus, "hours": scale.hours, "rows": {**raw, **history},
        "generate_s": generate_s, "raw_tables": disk,
        "bytes_per_stored_sample": round(
            sum(entry["bytes_on_disk"] for entry in disk.values()) / samples, 2),
        **query_latencies_s(client, scale),
    }

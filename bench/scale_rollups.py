"""Weeks of history at fleet scale: the hourly roll-ups (``features_hourly``,
``actuations_hourly``) of ``days`` days of ``gpus`` workers, generated straight into
ClickHouse a day at a time, then the latency of every panel of the trends dashboard over
the whole range.

Each worker gets one roll-up row per catalogue feature per hour (what the materialized
view keeps from its feature events), its value a hash-drawn number; each job gets an hourly
count per policy and action.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from dsec.bench.scale_store import DASHBOARDS, JOBS, START_S, grafana_sql, median_s
from dsec.schemas.features import WORKER_FEATURES

POLICIES = ("gpu-memory-leak", "bandwidth-latency-breaker", "nan-guard")
ACTIONS = ("snapshot", "precision", "memory_cap", "grad_compression")


@dataclass(frozen=True)
class RollupScale:
    gpus: int = 1000
    days: int = 30

    @property
    def seconds(self) -> int:
        return self.days * 86_400

    def feature_rows(self) -> int:
        return self.days * 24 * self.gpus * len(WORKER_FEATURES)

    def actuation_rows(self) -> int:
        return self.days * 24 * JOBS * len(POLICIES) * len(ACTIONS)


def _features_day(day: int, gpus: int) -> str:
    per_hour = gpus * len(WORKER_FEATURES)
    names = ", ".join(f"'{feature}'" for feature in WORKER_FEATURES)
    return (
        "INSERT INTO features_hourly SELECT hour, job_id, worker_id, feature, avgState(v), "
        "minState(v), maxState(v), countState() FROM ("
        f"SELECT toDateTime({START_S + day * 86_400} + intDiv(number, {per_hour}) * 3600, "
        "'UTC') AS hour, "
        f"concat('job-', toString(intDiv(number, {len(WORKER_FEATURES)}) % {gpus} % {JOBS})) "
        f"AS job_id, concat('w', toString(intDiv(number, {len(WORKER_FEATURES)}) % {gpus})) "
        f"AS worker_id, [{names}][1 + number % {len(WORKER_FEATURES)}] AS feature, "
        f"(cityHash64(number, {day}) % 100000) / 1000.0 AS v "
        f"FROM numbers({24 * per_hour})) GROUP BY hour, job_id, worker_id, feature"
    )


def _actuations(scale: RollupScale) -> str:
    per_hour = JOBS * len(POLICIES) * len(ACTIONS)
    policies = ", ".join(f"'{name}'" for name in POLICIES)
    actions = ", ".join(f"'{name}'" for name in ACTIONS)
    return (
        "INSERT INTO actuations_hourly SELECT "
        f"toDateTime({START_S} + intDiv(number, {per_hour}) * 3600, 'UTC'), "
        f"concat('job-', toString(number % {JOBS})), "
        f"[{policies}][1 + intDiv(number, {JOBS}) % {len(POLICIES)}], "
        f"[{actions}][1 + intDiv(number, {JOBS * len(POLICIES)}) % {len(ACTIONS)}], "
        f"cityHash64(number) % 20 FROM numbers({scale.actuation_rows()})"
    )


def generate_rollups(client, scale: RollupScale) -> float:
    """Writes the roll-ups; seconds taken."""
    start = time.perf_counter()
    for day in range(scale.days):
        client.command(_features_day(day, scale.gpus))
    client.command(_actuations(scale))
    return time.perf_counter() - start


def trend_panel_latencies_s(client, scale: RollupScale) -> dict[str, float]:
    """The median of three runs of every trends-dashboard panel over the whole range."""
    until_s = START_S + scale.seconds + 60
    dashboard = json.loads((DASHBOARDS / "trends.json").read_text())
    return {panel["title"]: median_s(client, grafana_sql(target["rawSql"], START_S, until_s))
            for panel in dashboard["panels"] for target in panel["targets"]}


def measure_rollups(client, scale: RollupScale) -> dict:
    """Generates the roll-ups in an empty store and times the trends dashboard over them."""
    generate_s = generate_rollups(client, scale)
    client.command("OPTIMIZE TABLE features_hourly FINAL")
    rows = client.query("SELECT count() FROM features_hourly").result_rows[0][0]
    return {"gpus": scale.gpus, "days": scale.days, "features_hourly_rows": int(rows),
            "generate_s": round(generate_s, 1),
            "trend_panels_s": trend_panel_latencies_s(client, scale)}

"""``dsec report cost``: what training cost over a period, from the stored history.

- Explicit: device-hours per pool (a worker's heartbeats say how long it ran; each GPU it
  reported is a device, a worker that reported none a device slot of its own), priced per
  GPU-hour, and split by the utilisation its GPUs reported into used and idle.
- Hidden: the control plane's own CPU and memory (each service process publishes its
  usage, ``infra/usage_reporter.py``), and the probes' share of every training step (the
  overhead the probe-overhead benchmark measured, ``probe_overhead_ratio``).
- Opportunity: device time spent degraded (fp16, 4-bit gradients, accumulation) per pool,
  from the applied commands and what undid them, and the goodput experiment's A/B return
  difference when its result is given.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsec.history import query
from dsec.infra.store.raw_schema import since_filter
from dsec.report import html_page, svg_chart
from dsec.schemas.settings import DsecSettings
from dsec.schemas.units import ms_to_s, s_to_ms

__all__ = [
    "CostReport", "DegradedTime", "PoolCost", "Prices", "ServiceCost", "cost_report",
    "degraded_intervals", "render_cost_html",
]

GIB = 1 << 30
NO_POOL = "(no pool)"
Query = Callable[[str, dict], dict]

SINCE = since_filter("{since:Int64}")  # raw samples from the report's start


@dataclass(frozen=True)
class Prices:
    gpu_hour: float
    cpu_core_hour: float
    memory_gib_hour: float
    probe_overhead_ratio: float

    @classmethod
    def of(cls, settings: DsecSettings) -> Prices:
        return cls(settings.cost_gpu_hour, settings.cost_cpu_core_hour,
                   settings.cost_memory_gib_hour, settings.probe_overhead_ratio)


@dataclass
class PoolCost:
    pool: str
    workers: int = 0
    device_hours: float = 0.0
    # device-hours whose GPUs reported utilisation, and the used share of those
    measured_hours: float = 0.0
    used_hours: float = 0.0

    @property
    def utilisation(self) -> float | None:
        return self.used_hours / self.measured_hours if self.measured_hours else None

    def cost(self, prices: Prices) -> float:
        return self.device_hours * prices.gpu_hour

    def idle_cost(self, prices: Prices) -> float | None:
        """The price of the measured device-hours that went unused."""
        if not self.measured_hours:
            return None
        return (self.measured_hours - self.used_hours) * prices.gpu_hour


@dataclass(frozen=True)
class ServiceCost:
    service: str
    host: str
    processes: int
    cpu_core_hours: float
    memory_gib_hours: float

    def cost(self, prices: Prices) -> float:
        return (self.cpu_core_hours * prices.cpu_core_hour
                + self.memory_gib_hours * prices.memory_gib_hour)


@dataclass(frozen=True)
class DegradedTime:
    pool: str
    mode: str
    hours: float

    def cost(self, prices: Prices) -> float:
        return self.hours * prices.gpu_hour


@dataclass
class CostReport:
    since_ms: int
    until_ms: int
    prices: Prices
    pools: list[PoolCost] = field(default_factory=list)
    services: list[ServiceCost] = field(default_factory=list)
    degraded: list[DegradedTime] = field(default_factory=list)
    experiment: dict[str, float | None] | None = None

    @property
    def device_hours(self) -> float:
        return sum(pool.device_hours for pool in self.pools)

    @property
    def explicit(self) -> float:
        return sum(pool.cost(self.prices) for pool in self.pools)

    @property
    def probe_cost(self) -> float:
        return self.device_hours * self.prices.probe_overhead_ratio * self.prices.gpu_hour

    @property
    def hidden(self) -> float:
        return sum(s.cost(self.prices) for s in self.services) + self.probe_cost

    @property
    def opportunity(self) -> float:
        return sum(d.cost(self.prices) for d in self.degraded)


# --- opportunity: what was degraded, and for how long --------------------------------------

def degraded_mode(action: str, params: dict[str, Any]) -> str | None:
    """The degraded mode an applied command puts a worker in, None when it ends one."""
    if action == "precision":
        return "fp16" if params.get("dtype") == "fp16" else None
    if action == "grad_compression":
        return "4-bit" if params.get("bits") == 4 else None
    if action == "grad_accumulation":
        return "accumulation" if int(params.get("steps", 1)) > 1 else None
    return None


def degraded_intervals(
    applied: Iterable[tuple[str, str, str, dict[str, Any], int]],
    last_seen_ms: dict[str, int], since_ms: int, until_ms: int,
) -> dict[tuple[str, str], float]:
    """(worker, mode) -> hours degraded inside [since, until]. ``applied``: (worker,
    action, _, params, time ms) of each applied command in time order; a mode lasts until
    a command of the same action ends it, or until the worker was last seen."""
    opened: dict[tuple[str, str], tuple[str, int]] = {}  # (worker, action) -> (mode, since)
    hours: dict[tuple[str, str], float] = {}

    def close(worker: str, mode: str, start_ms: int, end_ms: int) -> None:
        inside_ms = min(end_ms, until_ms) - max(start_ms, since_ms)
        if inside_ms > 0:
            hours[(worker, mode)] = hours.get((worker, mode), 0.0) + inside_ms / 3_600_000

    for worker, action, _pool, params, at_ms in applied:
        mode = degraded_mode(action, params)
        held = opened.pop((worker, action), None)
        if held is not None:
            close(worker, held[0], held[1], at_ms)
        if mode is not None:
            opened[(worker, action)] = (mode, at_ms)
    for (worker, _action), (mode, start_ms) in opened.items():
        close(worker, mode, start_ms, last_seen_ms.get(worker, until_ms))
    return hours


# --- the queries ----------------------------------------------------------------------------

def _rows(run: Query, sql: str, **params: Any) -> list[list]:
    return run(sql, params)["rows"]


def _pools(run: Query, since_ms: int) -> dict[str, str]:
    rows = _rows(run, """
        SELECT concat(job_id, '|', worker_id), argMax(pool, event_time) FROM features
        WHERE node_id != 'fleet' AND event_time >= fromUnixTimestamp64Milli({since:Int64})
        GROUP BY job_id, worker_id""", since=since_ms)
    return {worker: pool or NO_POOL for worker, pool in rows}


def _pool_costs(run: Query, since_ms: int, pools: dict[str, str]) -> list[PoolCost]:
    spans = _rows(run, """
        SELECT concat(job_id, '|', worker_id),
               (toUnixTimestamp64Milli(max(event_time)) - toUnixTimestamp64Milli(min(event_time)))
               / 1000 + any(interval_s)
        FROM raw_heartbeat WHERE """ + SINCE + """
        GROUP BY job_id, worker_id""", since=since_ms)
    gpus = {worker: (count, utilisation) for worker, count, utilisation in _rows(run, """
        SELECT concat(job_id, '|', worker_id), uniqExact(gpu_uuid), avg(utilisation_pct) / 100
        FROM raw_gpu WHERE """ + SINCE + """
        GROUP BY job_id, worker_id""", since=since_ms)}
    by_pool: dict[str, PoolCost] = {}
    for worker, span_s in spans:
        pool = by_pool.setdefault(pools.get(worker, NO_POOL),
                                  PoolCost(pools.get(worker, NO_POOL)))
        count, utilisation = gpus.get(worker, (0, None))
        hours = float(span_s) / 3600 * max(int(count), 1)
        pool.workers += 1
        pool.device_hours += hours
        if utilisation is not None and utilisation == utilisation:  # NaN: none reported
            pool.measured_hours += hours
            pool.used_hours += hours * float(utilisation)
    return sorted(by_pool.values(), key=lambda p: p.pool)


def _service_costs(run: Query, since_ms: int) -> list[ServiceCost]:
    rows = _rows(run, """
        SELECT service, host, started_at >= fromUnixTimestamp64Milli({since:Int64}),
               min(cpu_s), max(cpu_s), avg(rss_bytes),
               toUnixTimestamp64Milli(max(event_time)), toUnixTimestamp64Milli(min(event_time)),
               toUnixTimestamp64Milli(started_at)
        FROM process_usage WHERE event_time >= fromUnixTimestamp64Milli({since:Int64})
        GROUP BY service, host, pid, started_at""", since=since_ms)
    totals: dict[tuple[str, str], list[float]] = {}
    for service, host, started_inside, first_cpu, last_cpu, rss, last_ms, first_ms, start_ms \
            in rows:
        # A process started inside the period counts from its start; one started before
        # from its first reading inside (what it used before that is not known here).
        cpu_s = float(last_cpu) - (0.0 if started_inside else float(first_cpu))
        alive_s = ms_to_s(int(last_ms) - int(start_ms if started_inside else first_ms))
        entry = totals.setdefault((service, host), [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += cpu_s / 3600
        entry[2] += float(rss) / GIB * max(float(alive_s), 0.0) / 3600
    return [ServiceCost(service, host, int(n), core_h, gib_h)
            for (service, host), (n, core_h, gib_h) in sorted(totals.items())]


def _degraded(run: Query, since_ms: int, until_ms: int,
              pools: dict[str, str]) -> list[DegradedTime]:
    applied = [
        (worker, action, "", json.loads(params), int(at_ms))
        for worker, action, params, at_ms in _rows(run, """
            SELECT concat(r.job_id, '|', r.worker_id), a.action, a.params,
                   toUnixTimestamp64Milli(r.event_time) AS at_ms
            FROM actuation_results AS r INNER JOIN actuations AS a USING (actuation_id)
            WHERE r.status = 'applied'
              AND a.action IN ('precision', 'grad_compression', 'grad_accumulation')
              AND r.event_time <= fromUnixTimestamp64Milli({until:Int64})
            ORDER BY at_ms""", until=until_ms)]
    last_seen = {worker: int(at_ms) for worker, at_ms in _rows(run, """
        SELECT concat(job_id, '|', worker_id), toUnixTimestamp64Milli(max(event_time))
        FROM raw_heartbeat GROUP BY job_id, worker_id""")}
    by_pool: dict[tuple[str, str], float] = {}
    for (worker, mode), hours in degraded_intervals(applied, last_seen, since_ms,
                                                    until_ms).items():
        key = (pools.get(worker, NO_POOL), mode)
        by_pool[key] = by_pool.get(key, 0.0) + hours
    return [DegradedTime(pool, mode, hours) for (pool, mode), hours in sorted(by_pool.items())]


def experiment_difference(result: dict) -> dict[str, float | None]:
    """The dsec arm minus the plain one in a goodput experiment's result (``result.json``
    of ``dsec experiment run``, one seed or several combined; results from before the
    strong arm name the plain arm ``baseline``)."""
    plain = result["plain"] if "plain" in result else result["baseline"]
    out: dict[str, float | None] = {}
    for name in ("final_mean_return", "effective_training_time_ratio", "lost_work_s"):
        dsec_value, baseline = result["dsec"].get(name), plain.get(name)
        out[name] = None if dsec_value is None or baseline is None else dsec_value - baseline
    return out


def cost_report(settings: DsecSettings, since_ms: int, until_ms: int | None = None,
                experiment: Path | None = None, run: Query | None = None) -> CostReport:
    """``run``: how queries are answered (default: the stored history)."""
    until_ms = until_ms if until_ms is not None else s_to_ms(time.time())
    run = run or (lambda sql, params: query(settings, sql, params))
    pools = _pools(run, since_ms)
    report = CostReport(since_ms, until_ms, Prices.of(settings),
                        pools=_pool_costs(run, since_ms, pools),
                        services=_service_costs(run, since_ms),
                        degraded=_degraded(run, since_ms, until_ms, pools))
    if experiment is not None:
        report.experiment = experiment_difference(json.loads(experiment.read_text()))
    return report


# --- the HTML page -----------------------------------------------------------------------

def _table(head: list[str], rows: list[list[str]]) -> str:
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{header}</tr>{body}</table>" if rows else "<p><em>none</em></p>"


def render_cost_html(report: CostReport, tables: dict[str, tuple[list[str], list[list[str]]]],
                     title: str = "dsec cost report") -> str:
    """``tables``: the report's tables as the command line prints them (title -> head,
    rows), each with a bar chart of its cost column."""
    prices = report.prices
    charts = {
        "Explicit cost by pool": ([p.pool for p in report.pools],
                                  [p.cost(prices) for p in report.pools]),
        "Hidden cost by service": ([*(f"{s.service}@{s.host}" for s in report.services),
                                    "probes"],
                                   [*(s.cost(prices) for s in report.services),
                                    report.probe_cost]),
        "Opportunity cost by pool and mode": ([f"{d.pool} {d.mode}" for d in report.degraded],
                                              [d.cost(prices) for d in report.degraded]),
    }
    sections = []
    for name, (head, rows) in tables.items():
        labels, values = charts.get(name, ([], []))
        sections.append(f"<section><h2>{html.escape(name)}</h2>"
                        f"{svg_chart('bar', labels, values)}{_table(head, rows)}</section>")
    return html_page(title, sections)

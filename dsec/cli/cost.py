"""The cost report as tables: what ``dsec report cost`` prints and its HTML page shows."""

from __future__ import annotations

from dsec.cost import CostReport
from dsec.schemas.units import from_epoch_ms

Tables = dict[str, tuple[list[str], list[list[str]]]]


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.4f}"


def _hours(value: float) -> str:
    return f"{value:,.3f}"


def _when(epoch_ms: int) -> str:
    return from_epoch_ms(epoch_ms).strftime("%Y-%m-%d %H:%M:%S UTC")


def cost_tables(report: CostReport) -> Tables:
    prices = report.prices
    period = f"{_when(report.since_ms)} to {_when(report.until_ms)}"
    tables: Tables = {
        f"Cost, {period}": (["what", "cost"], [
            ["explicit (device-hours)", _money(report.explicit)],
            ["hidden (control plane, probes)", _money(report.hidden)],
            ["opportunity (time degraded)", _money(report.opportunity)],
            ["total", _money(report.explicit + report.hidden + report.opportunity)],
        ]),
        "Explicit cost by pool": (
            ["pool", "workers", "device-hours", "utilisation", "cost", "idle cost"],
            [[p.pool, str(p.workers), _hours(p.device_hours),
              "n/a" if p.utilisation is None else f"{p.utilisation:.1%}",
              _money(p.cost(prices)), _money(p.idle_cost(prices))] for p in report.pools]),
        "Hidden cost by service": (
            ["service", "host", "processes", "CPU core-hours", "memory GiB-hours", "cost"],
            [*([s.service, s.host, str(s.processes), _hours(s.cpu_core_hours),
                _hours(s.memory_gib_hours), _money(s.cost(prices))] for s in report.services),
             ["probes", "", "", "", "",
              _money(report.probe_cost)]]),
        "Opportunity cost by pool and mode": (
            ["pool", "mode", "hours degraded", "cost"],
            [[d.pool, d.mode, _hours(d.hours), _money(d.cost(prices))]
             for d in report.degraded]),
    }
    if report.experiment is not None:
        tables["Goodput experiment: dsec arm minus baseline"] = (
            ["what", "difference"],
            [[name, "n/a" if value is None else f"{value:+.4g}"]
             for name, value in report.experiment.items()])
    tables["Prices"] = (["what", "price"], [
        ["GPU-hour", _money(prices.gpu_hour)], ["CPU core-hour", _money(prices.cpu_core_hour)],
        ["memory GiB-hour", _money(prices.memory_gib_hour)],
        ["probe overhead (share of step time)", f"{prices.probe_overhead_ratio:.2%}"]])
    return tables

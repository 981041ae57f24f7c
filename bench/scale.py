"""``dsec bench scale``: how the control plane's cost grows with the fleet.

Per fleet size, each in a fresh process so that one size's memory does not carry into
the next: the policy engine's whole step (and its cost per target), the metrics stream
job's CPU per message and per sample at probe rates, its state bytes per worker and
feature events per CPU second, and each one's resident memory. Once: a generated
history in ClickHouse (bytes on disk per stored sample, analysis query latencies), and
weeks of generated hourly roll-ups (the trends dashboard's latencies).
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer


def _in_fresh_process(function: Callable[..., dict], *args: Any) -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def _in_new_store(measure: Callable[[Any, Any], dict], scale: Any, directory: str) -> dict:
    """``measure(client, scale)`` on a new embedded store in ``directory``."""
    from dsec.infra.store.clickhouse import connect, ensure_schema

    client = connect(f"chdb://{Path(directory) / 'store'}")
    try:
        ensure_schema(client, ttl_days=3650)  # the generated history is dated ahead
        return measure(client, scale)
    finally:
        client.close()


def _with_stage_ratio(process: dict, stream_job: list[dict]) -> dict:
    """The process's CPU per message over the ``MetricsJob`` stage's at the same fleet
    size, where both were measured: what Faust and the Kafka clients add to each message."""
    if process["flushes_per_s"] != 1:  # the stage's messages hold a whole second each
        return {**process, "cpu_per_message_vs_stage": None}
    stage = next((entry["cpu_s_per_message"] for entry in stream_job
                  if entry["workers"] == process["workers"]), None)
    cpu = process["cpu_s_per_message"]
    ratio = round(cpu / stage, 2) if cpu is not None and stage else None
    return {**process, "cpu_per_message_vs_stage": ratio}


def run_scale(fleet_sizes: list[int], store_gpus: int, store_hours: float,
              rollup_gpus: int = 1000, rollup_days: int = 0,
              process_workers: list[int] | None = None, process_seconds: int = 10,
              process_flushes_per_s: list[int] | None = None) -> dict:
    from dsec.bench.scale_fleet import ProbeRates, measure_engine, measure_stream_job
    from dsec.bench.scale_process import measure_stream_process
    from dsec.bench.scale_rollups import RollupScale, measure_rollups
    from dsec.bench.scale_store import StoreScale, measure_store

    engine = [_in_fresh_process(measure_engine, n) for n in fleet_sizes]
    stream_job = [_in_fresh_process(measure_stream_job, n) for n in fleet_sizes]
    first_engine, first_job = engine[0]["per_target_us"], stream_job[0]["cpu_s_per_message"]
    for entry in engine:
        entry["per_target_vs_smallest"] = round(entry["per_target_us"] / first_engine, 2)
    for entry in stream_job:
        entry["per_message_vs_smallest"] = round(entry["cpu_s_per_message"] / first_job, 2)
    result: dict[str, Any] = {
        "probe_rates": ProbeRates().__dict__, "engine": engine, "stream_job": stream_job,
    }
    if process_workers:
        result["stream_process"] = [
            _with_stage_ratio(measure_stream_process(n, process_seconds, flushes), stream_job)
            for n in process_workers for flushes in process_flushes_per_s or [1]]
    if store_hours > 0:
        with tempfile.TemporaryDirectory(prefix="dsec-scale-") as directory:
            result["store"] = _in_fresh_process(
                _in_new_store, measure_store,
                StoreScale(gpus=store_gpus, hours=store_hours), directory)
    if rollup_days > 0:
        with tempfile.TemporaryDirectory(prefix="dsec-scale-") as directory:
            result["rollups"] = _in_fresh_process(
                _in_new_store, measure_rollups,
                RollupScale(gpus=rollup_gpus, days=rollup_days), directory)
    return result


def _positive_ints(text: str, option: str) -> list[int]:
    sizes = [int(size) for size in text.split(",") if size.strip()]
    if sizes and min(sizes) < 1:
        raise typer.BadParameter("give positive numbers", param_hint=option)
    return sizes


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    return value


def scale(
    workers: Annotated[str, typer.Option(help="Fleet sizes, comma-separated.")]
    = "1000,10000,100000",
    store_gpus: Annotated[int, typer.Option(min=1, max=100_000)] = 100,
    store_hours: Annotated[float, typer.Option(
        min=0, max=24 * 30, help="Hours of generated history; 0: skip the store.")] = 24.0,
    rollup_gpus: Annotated[int, typer.Option(min=1, max=100_000)] = 1000,
    rollup_days: Annotated[int, typer.Option(
        min=0, max=365, help="Days of generated hourly roll-ups; 0: skip them.")] = 30,
    process_workers: Annotated[str, typer.Option(
        help="Fleet sizes, comma-separated, whose probe messages the whole stream-job "
             "process works through beside a local broker; empty: skip it.")] = "1000",
    process_seconds: Annotated[int, typer.Option(
        min=1, max=3600, help="Seconds of every worker's messages for that process.")] = 10,
    process_flushes_per_s: Annotated[str, typer.Option(
        help="Messages a worker sends a second, comma-separated, one process run each: 1, "
             "or 4 as the probe's default flush interval (0.25 s) sends while a worker "
             "syncs its gradients every step.")] = "1,4",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Engine step, stream-job cost and state per worker, memory, storage, queries and
    dashboards over weeks of roll-ups, against the fleet size."""
    sizes = _positive_ints(workers, "--workers")
    if not sizes:
        raise typer.BadParameter("give one or more positive fleet sizes", param_hint="--workers")
    process_sizes = _positive_ints(process_workers, "--process-workers")
    flushes = _positive_ints(process_flushes_per_s, "--process-flushes-per-s")
    result = _rounded(run_scale(sizes, store_gpus, store_hours, rollup_gpus, rollup_days,
                                process_sizes, process_seconds, flushes))
    if as_json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        typer.echo(f"{key}: {json.dumps(value, indent=1)}")

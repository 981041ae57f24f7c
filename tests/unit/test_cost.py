"""The cost report on a history with known answers, stored in a real chDB store."""

from __future__ import annotations

import json
import threading
import time

import pytest
from typer.testing import CliRunner

from dsec.cli import app
from dsec.cli.cost import cost_tables
from dsec.cost import cost_report, degraded_intervals, render_cost_html
from dsec.infra.store import rows
from dsec.infra.store.clickhouse import connect, ensure_schema
from dsec.infra.store.query_server import run_readonly
from dsec.infra.store.raw_columns import RawColumnsBuilder
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    FeatureEvent,
    GpuSample,
    HeartbeatSample,
    MetricBatch,
    WorkerIdentity,
)
from dsec.schemas.actuations import GradCompressionParams, PrecisionParams
from dsec.schemas.frames import batch_frames
from dsec.schemas.settings import DsecSettings
from dsec.schemas.usage import ProcessUsage

NOW_MS = int(time.time() * 1000) // 1000 * 1000
HOUR_MS = 3_600_000
SINCE_MS = NOW_MS - 2 * HOUR_MS


def _worker(name: str, pool: str | None) -> WorkerIdentity:
    return WorkerIdentity(job_id="job", worker_id=name, node_id="n0", pool=pool)


def _store(tmp_path):
    client = connect(f"chdb://{tmp_path / 'clickhouse'}")
    ensure_schema(client)
    builder = RawColumnsBuilder()
    # a0 (pool A): one GPU at 50 % for an hour; a1 (pool A): two GPUs at 100 % for half an
    # hour; c0 (no pool): a CPU run of an hour (a device slot, utilisation unknown)
    for name, pool, hours, gpus, utilisation in (("a0", "A", 1.0, 1, 50.0),
                                                 ("a1", "A", 0.5, 2, 100.0),
                                                 ("c0", None, 1.0, 0, None)):
        start = NOW_MS - HOUR_MS - HOUR_MS // 2
        samples = [HeartbeatSample(event_time_ms=start + int(t * hours * HOUR_MS),
                                   interval_s=0.001) for t in (0.0, 0.5, 1.0)]
        samples += [GpuSample(event_time_ms=start + i, gpu_uuid=f"GPU-{name}-{i}",
                              memory_used_bytes=1, memory_total_bytes=2,
                              utilisation_pct=utilisation) for i in range(gpus)]
        batch = MetricBatch(identity=_worker(name, pool), samples=samples)
        builder.add(batch, batch_frames(batch))
        event = FeatureEvent(identity=_worker(name, pool), event_time_ms=start,
                             features={"steps_total": 1.0},
                             tags={"pool": pool} if pool else {})
        client.insert("features", rows.feature_rows(event), column_names=rows.FEATURE_COLUMNS)
    for table, arrow in builder.tables().items():
        client.insert_arrow(table, arrow)
    # a0 ran in fp16 for 20 minutes and with 4-bit gradients from 10 minutes before the
    # period until its last heartbeat (90 minutes into the period)
    for n, (params, at_ms) in enumerate((
            (GradCompressionParams(bits=4), SINCE_MS - 10 * 60_000),
            (PrecisionParams(dtype="fp16"), NOW_MS - 80 * 60_000),
            (PrecisionParams(dtype="bf16"), NOW_MS - 60 * 60_000))):
        command = ActuationCommand(actuation_id=f"command-{n}", event_time_ms=at_ms,
                                   target=_worker("a0", "A"), expires_at_ms=at_ms + 60_000,
                                   policy_name="p", policy_version=1, action=params)
        result = ActuationResult(actuation_id=command.actuation_id, event_time_ms=at_ms,
                                 identity=_worker("a0", "A"), action_kind=params.kind.value,
                                 status=ActuationStatus.APPLIED)
        client.insert("actuations", rows.actuation_rows(command),
                      column_names=rows.ACTUATION_COLUMNS)
        client.insert("actuation_results", rows.result_rows(result),
                      column_names=rows.RESULT_COLUMNS)
    # the stack process: 360 CPU seconds and 2 GiB over the last hour; started before
    for at_ms, cpu_s in ((NOW_MS - HOUR_MS, 1000.0), (NOW_MS, 1360.0)):
        usage = ProcessUsage(event_time_ms=at_ms, service="stream-jobs", host="h", pid=7,
                             started_at_ms=SINCE_MS - HOUR_MS, cpu_s=cpu_s, rss_bytes=2 << 30)
        client.insert("process_usage", rows.usage_rows(usage), column_names=rows.USAGE_COLUMNS)
    return client


@pytest.fixture
def history(tmp_path):
    client = _store(tmp_path)
    lock = threading.Lock()
    yield lambda sql, params: run_readonly(client, lock, sql, params)
    client.close()


def test_explicit_hidden_and_opportunity_cost_with_known_answers(history, tmp_path) -> None:
    settings = DsecSettings(cost_gpu_hour=2.0, cost_cpu_core_hour=0.1,
                            cost_memory_gib_hour=0.01, probe_overhead_ratio=0.01)
    result_file = tmp_path / "result.json"
    result_file.write_text(json.dumps({"dsec": {"final_mean_return": 180.0},
                                       "baseline": {"final_mean_return": 150.0}}))
    report = cost_report(settings, SINCE_MS, NOW_MS, experiment=result_file, run=history)
    pools = {p.pool: p for p in report.pools}
    assert pools["A"].workers == 2
    assert pools["A"].device_hours == pytest.approx(1.0 + 2 * 0.5, rel=1e-3)
    assert pools["A"].utilisation == pytest.approx((0.5 * 1 + 1.0 * 1) / 2, rel=1e-3)
    assert pools["A"].cost(report.prices) == pytest.approx(4.0, rel=1e-3)
    assert pools["A"].idle_cost(report.prices) == pytest.approx(1.0, rel=1e-3)
    assert pools["(no pool)"].utilisation is None
    assert report.explicit == pytest.approx(6.0, rel=1e-3)
    (service,) = report.services
    assert service.cpu_core_hours == pytest.approx(0.1)
    assert service.memory_gib_hours == pytest.approx(2.0)
    assert report.probe_cost == pytest.approx(3.0 * 0.01 * 2.0, rel=1e-3)
    assert report.hidden == pytest.approx(0.01 + 0.02 + 0.06, rel=1e-3)
    degraded = {(d.pool, d.mode): d.hours for d in report.degraded}
    assert degraded == pytest.approx({("A", "fp16"): 20 / 60, ("A", "4-bit"): 1.5}, rel=1e-3)
    assert report.opportunity == pytest.approx((20 / 60 + 1.5) * 2.0, rel=1e-3)
    assert report.experiment == {"final_mean_return": 30.0,
                                 "effective_training_time_ratio": None, "lost_work_s": None}
    tables = cost_tables(report)
    page = render_cost_html(report, tables)
    assert page.count("<svg") == 3 and "<script" not in page
    assert "Opportunity cost by pool and mode" in page and "fp16" in page


def test_degraded_intervals_close_on_the_undo_or_the_last_sighting() -> None:
    applied = [("w", "grad_accumulation", "", {"steps": 4}, 0),
               ("w", "grad_accumulation", "", {"steps": 8}, 1_800_000),  # still degraded
               ("w", "grad_accumulation", "", {"steps": 1}, 3_600_000),
               ("v", "precision", "", {"dtype": "fp16"}, 0)]
    hours = degraded_intervals(applied, {"v": 7_200_000}, since_ms=0, until_ms=10_800_000)
    assert hours == {("w", "accumulation"): 1.0, ("v", "fp16"): 2.0}


def test_the_cost_command_prints_three_costs(tmp_path) -> None:
    client = _store(tmp_path)
    client.close()
    result = CliRunner().invoke(app, ["report", "cost", "--since", "3h", "--html",
                                      str(tmp_path / "cost.html")],
                                env={"DSEC_DATA_DIR": str(tmp_path), "DSEC_CLICKHOUSE_DSN": ""})
    assert result.exit_code == 0, result.output
    for line in ("explicit (device-hours)", "hidden (control plane, probes)",
                 "opportunity (time degraded)"):
        assert line in result.output
    assert (tmp_path / "cost.html").read_text().startswith("<!doctype html>")


def test_a_process_reads_its_own_cpu_time_and_memory() -> None:
    from dsec.infra.usage_reporter import read_usage

    usage = read_usage("stream-jobs", started_at_ms=NOW_MS)
    assert usage.cpu_s > 0 and usage.rss_bytes > 10 << 20
    assert usage.service == "stream-jobs" and usage.started_at_ms == NOW_MS

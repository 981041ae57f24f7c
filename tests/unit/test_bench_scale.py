"""``dsec bench scale``'s parts at a tiny size: each measures what it says, on real stages
and a real ClickHouse engine."""

from __future__ import annotations

import pytest

from dsec.bench.scale_fleet import ProbeRates, measure_engine, measure_stream_job, worker_second
from dsec.bench.scale_store import StoreScale, measure_store
from dsec.infra.store.clickhouse import connect, ensure_schema
from dsec.schemas.features import WORKER_FEATURES


def test_a_worker_second_carries_the_probe_rates() -> None:
    rates = ProbeRates()
    batch = worker_second(7, 10, rates)  # second 10: an episode and a heartbeat too
    kinds = batch.columns.kinds()
    assert len(kinds["step"].step) == rates.steps_per_s
    assert len(kinds["grad_sync"].step) == rates.grad_syncs_per_s
    assert set(kinds) == {"step", "grad_sync", "gpu", "heartbeat", "episode"}
    assert "episode" not in worker_second(7, 11, rates).columns.kinds()
    assert rates.samples_per_s() == pytest.approx(4 + 4 + 1 + 0.2 + 0.2)


def test_the_stream_job_keeps_state_and_makes_one_feature_event_per_message() -> None:
    result = measure_stream_job(20)
    assert result["workers"] == 20
    assert result["state_bytes_per_worker"] > 100
    assert result["feature_events_per_cpu_s"] > 0  # every timed message made its event
    assert result["rss_bytes"] > 0


def test_the_engine_step_is_timed_per_target() -> None:
    result = measure_engine(50)
    assert result["step_ms"] > 0
    assert result["per_target_us"] == pytest.approx(result["step_ms"] * 1000 / 50)
    assert result["step_from_events_ms"] > 0  # the same step from decoded events
    assert result["step_from_wire_ms"] > 0  # and from the features topic's bytes
    assert result["step_from_columns_ms"] > 0  # as single events and as columns


def test_the_generated_history_has_the_stated_rows_and_is_measured(tmp_path) -> None:
    scale = StoreScale(gpus=3, hours=0.02)  # 72 s
    client = connect(f"chdb://{tmp_path / 'store'}")
    try:
        ensure_schema(client, ttl_days=3650)
        result = measure_store(client, scale)
        assert {table: entry["samples"] for table, entry in result["raw_tables"].items()} \
            == scale.raw_rows()
        features = client.query("SELECT count(), uniqExact(worker_id), uniqExact(feature) "
                                "FROM features").result_rows[0]
    finally:
        client.close()  # chDB holds one store per process: let the next test open its own
    assert features[0] == scale.history_rows()["features"]
    assert features[1] == 3
    assert result["bytes_per_stored_sample"] > 0
    assert result["ready_queries_s"] and result["history_panels_s"]


def test_the_generated_rollups_have_the_stated_rows_and_every_trend_panel_is_timed(
        tmp_path) -> None:
    from dsec.bench.scale_rollups import RollupScale, measure_rollups

    scale = RollupScale(gpus=3, days=2)
    client = connect(f"chdb://{tmp_path / 'store'}")
    try:
        ensure_schema(client, ttl_days=3650)
        result = measure_rollups(client, scale)
        per_job = client.query("SELECT job_id, sum(actuations) > 0 FROM actuations_hourly "
                               "GROUP BY job_id ORDER BY job_id").result_rows
        hours = client.query("SELECT uniqExact(hour), uniqExact(worker_id), "
                             "uniqExact(feature) FROM features_hourly").result_rows[0]
    finally:
        client.close()
    assert result["features_hourly_rows"] == scale.feature_rows()
    assert hours[0] == 48 and hours[1] == 3 and hours[2] == len(WORKER_FEATURES)
    assert [row[1] for row in per_job] == [1, 1, 1, 1]  # an hourly count for every job
    assert len(result["trend_panels_s"]) == 9


def test_a_worker_second_split_into_flushes_keeps_every_sample_once_in_time_order() -> None:
    from dsec.bench.scale_process import split_flushes

    batch = worker_second(3, 10, ProbeRates())
    flushes = split_flushes(batch, 4)
    assert len(flushes) == 4 and len({flush.event_id for flush in flushes}) == 4
    def samples(rows: list, kind: str) -> list[dict]:  # a row's id names its message
        return [row.model_dump(exclude={"event_id"}) for row in rows if row.kind == kind]

    for kind in {row.kind for row in batch.rows()}:
        split = [row for flush in flushes for row in flush.rows()]
        assert samples(split, kind) == samples(batch.rows(), kind)
    assert [flush.sample_count() for flush in flushes] == [5, 2, 2, 2]
    assert len(split_flushes(batch, 20)) == 4  # a flush with nothing in it sends nothing

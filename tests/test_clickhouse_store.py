"""The history tables on the real ClickHouse engine (chDB in a temporary folder)."""

from __future__ import annotations

import pytest

from dsec.infra.clickhouse import TABLES, connect, ensure_schema
from dsec.schemas import (
    EpisodeSample,
    FeatureEvent,
    HeartbeatSample,
    MetricBatch,
    StepSample,
    WorkerIdentity,
)
from dsec.stream_jobs import rows

IDENTITY = WorkerIdentity(job_id="job", worker_id="w0", node_id="n0")


@pytest.fixture
def client(tmp_path):
    client = connect(f"chdb://{tmp_path / 'ch'}")
    yield client
    client.close()


def test_schema_is_created_idempotently(client) -> None:
    ensure_schema(client, ttl_days=7)
    ensure_schema(client, ttl_days=7)
    names = {row[0] for row in client.query("SHOW TABLES").result_rows}
    assert set(TABLES) <= names
    ddl = client.query("SHOW CREATE TABLE raw_metrics").result_rows[0][0]
    assert "PARTITION BY toDate(event_time)" in ddl and "toIntervalDay(7)" in ddl


def test_metric_rows_land_and_a_replayed_batch_is_not_doubled(client) -> None:
    ensure_schema(client)
    batch = MetricBatch(identity=IDENTITY, samples=[
        StepSample(event_time_ms=1_800_000_000_000, step=7, loss=0.5, grad_norm=2.0),
        EpisodeSample(event_time_ms=1_800_000_000_001, episode_index=3, reward=21.0, length=21,
                      termination_reason="pole_fell"),
        HeartbeatSample(event_time_ms=1_800_000_000_002, interval_s=5.0, samples_dropped=4),
    ])
    metric_rows = rows.metric_rows(batch)
    for _ in range(2):
        client.insert("raw_metrics", metric_rows, column_names=rows.RAW_METRICS_COLUMNS,
                      settings={"insert_deduplication_token": "metrics/0@5..metrics/0@5"})
    result = client.query(
        "SELECT kind, step, values['grad_norm'], values['reward'], labels['termination_reason'],"
        " values['samples_dropped'] FROM raw_metrics ORDER BY event_time"
    ).result_rows
    assert result == [
        ("step", 7, 2.0, 0.0, "", 0.0),
        ("episode", 3, 0.0, 21.0, "pole_fell", 0.0),
        ("heartbeat", 0, 0.0, 0.0, "", 4.0),
    ]


def test_feature_rows_are_long_format(client) -> None:
    ensure_schema(client)
    event = FeatureEvent(identity=IDENTITY, window="w",
                         features={"reward_mean": 1.5, "reward_variance": 0.25})
    client.insert("features", rows.feature_rows(event), column_names=rows.FEATURE_COLUMNS)
    result = client.query("SELECT feature, value FROM features ORDER BY feature").result_rows
    assert result == [("reward_mean", 1.5), ("reward_variance", 0.25)]

"""The history tables on the real ClickHouse engine (chDB in a temporary folder)."""

from __future__ import annotations

import fcntl
import re
import subprocess
import sys

import pytest

from dsec.infra.store import rows
from dsec.infra.store.clickhouse import (
    RAW_MESSAGE_TABLES,
    RAW_TABLES,
    TABLES,
    connect,
    ensure_schema,
    store_locked,
)
from dsec.infra.store.raw_columns import RawColumnsBuilder
from dsec.schemas import (
    EpisodeSample,
    FeatureEvent,
    HeartbeatSample,
    MetricBatch,
    MetricColumns,
    StepSample,
    WorkerIdentity,
)
from dsec.schemas.frames import batch_frames
from dsec.schemas.metrics import StepColumns

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
    assert set(TABLES) | set(RAW_TABLES) | {"raw_metrics"} <= names
    assert set(RAW_MESSAGE_TABLES) <= names
    ddl = client.query("SHOW CREATE TABLE raw_step_messages").result_rows[0][0]
    assert "PARTITION BY toDate(event_time)" in ddl and "toIntervalDay(7)" in ddl


def test_raw_samples_land_column_wise_and_a_replayed_insert_is_not_doubled(client) -> None:
    ensure_schema(client)
    batch = MetricBatch(identity=IDENTITY, samples=[
        StepSample(event_time_ms=1_800_000_000_000, step=7, loss=0.5, grad_norm=2.0),
        EpisodeSample(event_time_ms=1_800_000_000_001, episode_index=3, reward=21.0, length=21,
                      termination_reason="pole_fell"),
        HeartbeatSample(event_time_ms=1_800_000_000_002, interval_s=5.0, samples_dropped=4),
    ])
    builder = RawColumnsBuilder()
    builder.add(batch, batch_frames(batch))
    for _ in range(2):
        for table, arrow_table in builder.tables().items():
            client.insert_arrow(table, arrow_table,
                                settings={"insert_deduplication_token": f"{table}:same"})
    result = client.query(
        "SELECT kind, step, values['grad_norm'], values['reward'], labels['termination_reason'],"
        " values['samples_dropped'], worker_id, seq FROM raw_metrics ORDER BY event_time"
    ).result_rows
    assert [row[:6] for row in result] == [
        ("step", 7, 2.0, 0.0, "", 0.0),
        ("episode", 3, 0.0, 21.0, "pole_fell", 0.0),
        ("heartbeat", 0, 0.0, 0.0, "", 4.0),
    ]
    assert {row[6] for row in result} == {"w0"} and {row[7] for row in result} == {0}
    steps = client.query("SELECT loss, grad_norm, step_time_ms FROM raw_step").result_rows
    assert steps == [(0.5, 2.0, None)]  # a missing optional number is NULL, not 0


def test_columnar_and_row_batches_store_alike(client) -> None:
    ensure_schema(client)
    columns = MetricColumns(step=StepColumns(
        event_time_ms=[1_800_000_000_000, 1_800_000_000_001], step=[1, 2],
        loss=[0.25, None], grad_norm=[1.0, 3.0], loss_nonfinite=[False, True],
    ))
    batch = MetricBatch(identity=IDENTITY, columns=columns)
    builder = RawColumnsBuilder()
    builder.add(batch, batch_frames(batch))
    for table, arrow_table in builder.tables().items():
        client.insert_arrow(table, arrow_table)
    result = client.query(
        "SELECT step, loss, grad_norm, loss_nonfinite FROM raw_step ORDER BY step").result_rows
    assert result == [(1, 0.25, 1.0, False), (2, None, 3.0, True)]


def test_feature_rows_are_long_format(client) -> None:
    ensure_schema(client)
    event = FeatureEvent(identity=IDENTITY, window="w",
                         features={"reward_mean": 1.5, "reward_variance": 0.25})
    client.insert("features", rows.feature_rows(event), column_names=rows.FEATURE_COLUMNS)
    result = client.query("SELECT feature, value FROM features ORDER BY feature").result_rows
    assert result == [("reward_mean", 1.5), ("reward_variance", 0.25)]


def test_decisions_keep_their_stage_and_older_stores_gain_the_column(client) -> None:
    from dsec.schemas import PolicyDecision
    from dsec.schemas.policies import DecisionKind

    ensure_schema(client)
    client.command("ALTER TABLE policy_decisions DROP COLUMN stage")  # a store made before
    ensure_schema(client)
    decision = PolicyDecision(policy_name="bandwidth-latency-breaker", policy_version=1,
                              identity=IDENTITY, decision=DecisionKind.STAGED_UP, stage=2)
    client.insert("policy_decisions", rows.decision_rows(decision),
                  column_names=rows.DECISION_COLUMNS)
    assert client.query("SELECT decision, stage FROM policy_decisions").result_rows == [
        ("staged_up", 2)]


def test_results_keep_requested_and_in_force_apart_and_older_stores_gain_them(client) -> None:
    from dsec.schemas import ActuationResult, ActuationStatus

    ensure_schema(client)
    for column in ("requested", "in_force"):  # a store made before results carried them
        client.command(f"ALTER TABLE actuation_results DROP COLUMN {column}")
    ensure_schema(client)
    results = [
        ActuationResult(actuation_id="a1", identity=IDENTITY, action_kind="precision",
                        status=ActuationStatus.APPLIED, requested="bf16", in_force="fp16"),
        ActuationResult(actuation_id="a2", identity=IDENTITY, action_kind="grad_compression",
                        status=ActuationStatus.UNSUPPORTED, requested="4"),
    ]
    for result in results:
        client.insert("actuation_results", rows.result_rows(result),
                      column_names=rows.RESULT_COLUMNS)
    assert client.query("SELECT actuation_id, status, requested, in_force "
                        "FROM actuation_results ORDER BY actuation_id").result_rows == [
        ("a1", "applied", "bf16", "fp16"), ("a2", "unsupported", "4", None)]


def test_a_raw_table_made_before_a_field_was_added_gains_its_column(client) -> None:
    ensure_schema(client)
    batch = MetricBatch(identity=IDENTITY, samples=[
        StepSample(event_time_ms=1_800_000_000_000 + i, step=i, loss=0.5, grad_norm=1.0,
                   loss_nonfinite=True, grad_norm_source="trainer") for i in range(3)])
    builder = RawColumnsBuilder()
    builder.add(batch, batch_frames(batch))
    added = ("loss", "loss_nonfinite", "grad_norm_source")  # a float, a flag, a label
    (table, arrow_table), = builder.tables().items()
    client.insert_arrow(table, arrow_table.drop_columns(list(added)))  # a store made before
    for column in added:  # the step sample carried them
        client.command(f"ALTER TABLE raw_step_messages DROP COLUMN {column}")
    ensure_schema(client)
    types = dict(client.query(
        "SELECT name, type FROM system.columns WHERE database = currentDatabase() "
        f"AND table = 'raw_step_messages' AND name IN {added}").result_rows)
    assert types == {"loss": "Array(Float64)", "loss_nonfinite": "Array(Bool)",
                     "grad_norm_source": "Array(LowCardinality(String))"}
    # the rows stored before have one default value per sample: unknown, unset, ''
    assert client.query("SELECT seq, grad_norm, loss, loss_nonfinite, grad_norm_source "
                        "FROM raw_step ORDER BY seq").result_rows == [
        (i, 1.0, None, False, "") for i in range(3)]
    assert client.query("SELECT count() FROM raw_metrics").result_rows == [(3,)]


def test_a_store_is_locked_while_its_status_file_is_held(tmp_path) -> None:
    status = tmp_path / "status"
    assert not store_locked(status)  # no status file: no engine has it open
    status.write_text("")
    with status.open("rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert store_locked(status)
    assert not store_locked(status)


def test_connect_waits_for_the_process_holding_the_store_to_let_go(tmp_path) -> None:
    """As a sink starting beside its killed predecessor's, still closing the store."""
    dsn = f"chdb://{tmp_path / 'ch'}"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from dsec.infra.store.clickhouse import connect\n"
         f"client = connect({dsn!r}); client.query('SELECT 1')\n"
         "print('held', flush=True); time.sleep(2)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert store_locked(tmp_path / "ch" / "status")
        client = connect(dsn, wait_for_lock_s=120)
        assert client.query("SELECT 1").result_rows == [(1,)]
        client.close()
    finally:
        holder.kill()
        holder.wait()


def test_exported_batches_are_batches_that_replay_reads(client) -> None:
    import threading

    from dsec.infra.store.export import export_batches
    from dsec.infra.store.query_server import run_readonly

    ensure_schema(client)
    batch = MetricBatch(identity=IDENTITY, samples=[
        StepSample(event_time_ms=1_800_000_000_000, step=7, loss=0.5, grad_norm=2.0),
        StepSample(event_time_ms=1_800_000_000_001, step=8, grad_norm_source="trainer"),
        EpisodeSample(event_time_ms=1_800_000_000_002, episode_index=3, reward=21.0, length=21,
                      termination_reason="pole_fell"),
        HeartbeatSample(event_time_ms=1_800_000_000_003, interval_s=5.0, samples_dropped=4),
    ])
    builder = RawColumnsBuilder()
    builder.add(batch, batch_frames(batch))
    for table, arrow_table in builder.tables().items():
        client.insert_arrow(table, arrow_table)
    lock = threading.Lock()
    def export() -> list[bytes]:
        return list(export_batches(lambda sql, params: run_readonly(client, lock, sql, params),
                                   since_ms=0))

    lines = export()
    assert export() == lines  # the same ids, so a second replay stores nothing new
    exported = [MetricBatch.model_validate_json(line) for line in lines]  # no '' labels
    frames = {kind: frame for one in exported for kind, frame in batch_frames(one).items()}
    original = batch_frames(batch)
    assert len(exported) == 3 and frames.keys() == original.keys()  # one per kind here
    for kind, fields in original.items():
        for name, values in fields.items():
            assert [None if v != v else v for v in frames[kind][name].tolist()] == [
                None if v != v else v for v in values.tolist()], (kind, name)


def test_a_store_made_with_a_row_per_sample_keeps_those_rows_in_its_views(client) -> None:
    from dsec.bench.store_layout import per_sample_statements, per_sample_tables
    from dsec.schemas.fast_decode import DecodedBatch

    older = MetricBatch(identity=IDENTITY, samples=[
        StepSample(event_time_ms=1_800_000_000_000, step=1, loss=0.5),
        StepSample(event_time_ms=1_800_000_000_001, step=2)])
    client.command(next(s for s in per_sample_statements() if "raw_step " in s))
    client.insert_arrow("raw_step", per_sample_tables(
        [DecodedBatch(older, batch_frames(older))])["raw_step"])
    ensure_schema(client)
    ensure_schema(client)
    engines = dict(client.query("SELECT name, engine FROM system.tables "
                                "WHERE database = currentDatabase()").result_rows)
    assert engines["raw_step"] == "View" and engines["raw_step_per_sample"] == "MergeTree"
    batch = MetricBatch(identity=IDENTITY, samples=[
        StepSample(event_time_ms=1_800_000_000_002, step=3, loss=0.25),
        StepSample(event_time_ms=1_800_000_000_003, step=4, loss=0.125)])
    builder = RawColumnsBuilder()
    builder.add(batch, batch_frames(batch))
    builder.add(MetricBatch(identity=IDENTITY, samples=[]), {"step": batch_frames(
        MetricBatch(identity=IDENTITY, columns=MetricColumns(step=StepColumns(
            event_time_ms=[], step=[]))))["step"]})  # no samples: no row
    assert builder.message_ids() == {"raw_step_messages": [batch.event_id]}
    for table, arrow_table in builder.tables().items():
        client.insert_arrow(table, arrow_table)
    assert client.query("SELECT step, seq, loss FROM raw_step ORDER BY step").result_rows == [
        (1, 0, 0.5), (2, 1, None), (3, 0, 0.25), (4, 1, 0.125)]
    assert client.query("SELECT count() FROM raw_step WHERE message_time = event_time "
                        "AND step < 3").result_rows == [(2,)]  # a row per sample: its own
    assert client.query("SELECT count() FROM raw_metrics").result_rows == [(4,)]


def test_a_time_bounded_read_of_a_view_skips_the_messages_before_it(client) -> None:
    from dsec.infra.store.raw_schema import since_filter

    ensure_schema(client, ttl_days=3650)
    day_ms = 86_400_000
    builder = RawColumnsBuilder()
    for day in range(5):  # a message a day: five day partitions
        batch = MetricBatch(identity=IDENTITY, samples=[
            StepSample(event_time_ms=1_800_000_000_000 + day * day_ms + i, step=day * 10 + i)
            for i in range(3)])
        builder.add(batch, batch_frames(batch))
    (table, arrow_table), = builder.tables().items()
    client.insert_arrow(table, arrow_table)
    since = 1_800_000_000_000 + 3 * day_ms + 1
    sql = f"SELECT count(), min(step) FROM raw_step WHERE {since_filter(str(since))}"
    assert client.query(sql).result_rows == [(5, 31)]  # day 3's last two, and day 4's
    plan = "\n".join(row[0] for row in client.query(f"EXPLAIN indexes = 1 {sql}").result_rows)
    selected = [tuple(map(int, part.split("/"))) for part in
                re.findall(r"Parts: (\d+/\d+)", plan)]
    assert selected and min(read for read, _ in selected) < 5  # not every day's part
    assert client.query("SELECT DISTINCT toDate(message_time) = toDate(event_time) "
                        "FROM raw_metrics").result_rows == [(True,)]

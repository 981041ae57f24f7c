"""The store-layout bench: one row per message holds the very samples of one row per
sample, in both layouts' real tables (embedded ClickHouse)."""

from __future__ import annotations

import numpy as np

from dsec.bench.store_layout import (
    LAYOUTS,
    StoreLayoutOptions,
    message_table_statements,
    message_tables,
    probe_messages,
    run_store_layout_bench,
    sample_view_statements,
)
from dsec.infra.store.clickhouse import connect
from dsec.schemas.frames import FIELD_DTYPES


def test_a_message_row_holds_its_samples_as_arrays() -> None:
    decoded = probe_messages(StoreLayoutOptions(messages=6, samples_per_message=40, workers=3))
    (name, table), = message_tables(decoded).items()
    assert name == "msg_step" and table.num_rows == 6
    rows = table.to_pylist()
    assert [row["worker_id"] for row in rows] == [b.header.identity.worker_id for b in decoded]
    for row, batch in zip(rows, decoded, strict=True):
        frame = batch.frames["step"]
        assert row["message_id"] == batch.header.event_id
        assert row["times_ms"] == frame["event_time_ms"].tolist()
        assert np.array_equal(row["loss"], frame["loss"])
        assert row["event_time"].timestamp() * 1000 == frame["event_time_ms"][0]


def test_every_kind_has_a_message_table_and_a_per_sample_view_over_it(tmp_path) -> None:
    client = connect(f"chdb://{tmp_path / 'ch'}")
    for statement in [*message_table_statements(), *sample_view_statements()]:
        client.command(statement)
    decoded = probe_messages(StoreLayoutOptions(messages=4, samples_per_message=25, workers=2))
    client.insert_arrow("msg_step", message_tables(decoded)["msg_step"])
    assert client.query("SELECT count(), sum(length(loss)) FROM msg_step").result_rows == [
        (4, 100)]
    first = decoded[0].frames["step"]
    assert client.query(
        "SELECT seq, toUnixTimestamp64Milli(event_time), loss, worker_id FROM raw_step "
        "WHERE seq IN (0, 24) AND worker_id = 'worker-000' ORDER BY event_time, seq LIMIT 2"
    ).result_rows == [(0, int(first["event_time_ms"][0]), float(first["loss"][0]), "worker-000"),
                      (24, int(first["event_time_ms"][24]), float(first["loss"][24]),
                       "worker-000")]
    tables = {row[0] for row in client.query("SHOW TABLES").result_rows}
    assert tables == {f"{prefix}_{kind}" for kind in FIELD_DTYPES for prefix in ("msg", "raw")}
    client.close()


def test_the_bench_stores_the_same_samples_in_both_layouts(tmp_path) -> None:
    result = run_store_layout_bench(StoreLayoutOptions(
        messages=8, samples_per_message=50, workers=2, batch_messages=4), work=tmp_path)
    assert result["samples"] == 400
    assert result["per_sample"]["rows"] == 400 and result["per_message"]["rows"] == 8
    for layout in LAYOUTS:
        assert result[layout]["bytes_per_sample"] > 0
        assert result[layout]["insert_cpu_s_per_million_samples"] > 0
    assert result["insert_cpu_ratio"] > 0 and result["bytes_ratio"] > 0
    assert result["query_answers_match"] is True

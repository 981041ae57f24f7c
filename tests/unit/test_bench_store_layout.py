"""The store-layout bench: one row per sample holds the very samples of the store's row per
message, in both layouts' real tables (embedded ClickHouse)."""

from __future__ import annotations

import numpy as np

from dsec.bench.store_layout import (
    LAYOUTS,
    StoreLayoutOptions,
    per_sample_statements,
    per_sample_tables,
    probe_messages,
    run_store_layout_bench,
)
from dsec.infra.store.clickhouse import connect


def test_a_per_sample_row_holds_one_sample_numbered_within_its_message(tmp_path) -> None:
    decoded = probe_messages(StoreLayoutOptions(messages=3, samples_per_message=20, workers=3))
    (name, table), = per_sample_tables(decoded).items()
    assert name == "raw_step" and table.num_rows == 60
    assert table.column("seq").to_pylist() == list(range(20)) * 3
    assert np.array_equal(table.column("loss").to_numpy(),
                          np.concatenate([b.frames["step"]["loss"] for b in decoded]))
    client = connect(f"chdb://{tmp_path / 'ch'}")
    for statement in per_sample_statements():
        client.command(statement)
    client.insert_arrow("raw_step", table)
    assert client.query("SELECT uniqExact(worker_id), count() FROM raw_step").result_rows == [
        (3, 60)]
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

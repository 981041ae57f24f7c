"""Metric batches as message rows: a row per message and kind, each field's samples as an
array in the message's order (pure Arrow, no store)."""

from __future__ import annotations

import math

import pytest

from dsec.infra.store.raw_columns import RawColumnsBuilder, array_column_name
from dsec.infra.store.raw_schema import array_column_type, sample_view_statement
from dsec.schemas import EpisodeSample, GpuSample, MetricBatch, StepSample, WorkerIdentity
from dsec.schemas.frames import FIELD_DTYPES, batch_frames


def _batch(worker: str, start_ms: int) -> MetricBatch:
    return MetricBatch(identity=WorkerIdentity(job_id="j", node_id="n", worker_id=worker),
                       gpu_uuid="GPU-1", samples=[
        StepSample(event_time_ms=start_ms + 2, step=2, loss=0.25, grad_norm=1.0),
        StepSample(event_time_ms=start_ms + 1, step=1, grad_norm=2.0),  # out of order
        EpisodeSample(event_time_ms=start_ms, episode_index=0, reward=1.0, length=5),
    ])


def test_a_message_is_one_row_per_kind_with_its_samples_as_arrays() -> None:
    builder = RawColumnsBuilder()
    batches = [_batch("w0", 1_800_000_000_000), _batch("w1", 1_800_000_000_100)]
    for batch in batches:
        builder.add(batch, batch_frames(batch))
    tables = builder.tables()
    assert builder.samples == 6
    assert builder.message_ids() == {"raw_step_messages": [b.event_id for b in batches],
                                     "raw_episode_messages": [b.event_id for b in batches]}
    steps = tables["raw_step_messages"].to_pylist()
    assert [row["worker_id"] for row in steps] == ["w0", "w1"]
    first = steps[0]
    assert first["times_ms"] == [1_800_000_000_002, 1_800_000_000_001]  # the message's order
    assert first["event_time"].timestamp() * 1000 == 1_800_000_000_001  # its earliest
    assert first["step"] == [2, 1] and first["grad_norm"] == [1.0, 2.0]
    assert first["loss"][0] == 0.25 and math.isnan(first["loss"][1])  # missing: NaN
    assert first["grad_norm_source"] == ["", ""] and first["gpu_uuid"] == "GPU-1"
    assert set(first) - {"event_time", "job_id", "node_id", "worker_id", "gpu_uuid"} == {
        array_column_name(name) for name in FIELD_DTYPES["step"]}


def test_a_frame_that_does_not_fit_is_refused_whole() -> None:
    builder = RawColumnsBuilder()
    batch = _batch("w0", 1_800_000_000_000)
    frames = batch_frames(batch)
    frames["step"] = {**frames["step"], "loss": frames["step"]["loss"][:1]}
    with pytest.raises(ValueError, match=r"columns\.step\.loss"):
        builder.add(batch, frames)
    assert builder.tables() == {} and builder.samples == 0


def test_the_gpu_kind_keeps_its_uuid_per_sample_and_floats_read_as_null_when_missing() -> None:
    batch = MetricBatch(identity=WorkerIdentity(job_id="j", node_id="n", worker_id="w"),
                        samples=[GpuSample(event_time_ms=1_800_000_000_000, gpu_uuid="GPU-a",
                                           gpu_model="H100", memory_used_bytes=1,
                                           memory_total_bytes=2)])
    builder = RawColumnsBuilder()
    builder.add(batch, batch_frames(batch))
    row = builder.tables()["raw_gpu_messages"].to_pylist()[0]
    assert row["gpu_uuids"] == ["GPU-a"] and "gpu_uuid" not in row
    assert array_column_type("temperature_c", FIELD_DTYPES["gpu"]["temperature_c"]).startswith(
        "Array(Float64) DEFAULT arrayWithConstant(length(times_ms), nan)")
    view = sample_view_statement("gpu")
    assert "gpu_uuids AS gpu_uuid" in view
    assert "if(isNaN(temperature_c_element), NULL, temperature_c_element) AS temperature_c" in view

"""Poison inputs refused by the decoders, with the field named: nested lists, infinities in
packed columns, sample times the store would drop, and frames that do not fit a table."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from dsec.infra.store.raw_columns import RawColumnsBuilder
from dsec.schemas import DecodeError, MetricBatch, decode
from dsec.schemas.event_times import DAY_MS, EventTimeWindow, event_time_problem
from dsec.schemas.fast_decode import decode_metric_batch
from dsec.schemas.metrics import duplicate_key

NOW_MS = 1_800_000_000_000
IDENTITY = {"job_id": "j", "node_id": "n", "worker_id": "w"}


def _columns(kind: str, columns: dict) -> bytes:
    return orjson.dumps({"identity": IDENTITY, "columns": {kind: columns}})


def _packed(values: list[float]) -> dict:
    return {"dtype": "<f8", "data": base64.b64encode(np.array(values).tobytes()).decode()}


@pytest.mark.parametrize("field, value", [
    ("step", [[1, 2], [3, 4]]),
    ("grad_norm", [[1.0, 2.0], [3.0, 4.0]]),
    ("event_time_ms", [[NOW_MS, NOW_MS], [NOW_MS, NOW_MS]]),
])
def test_nested_lists_are_refused_like_the_model_refuses_them(field, value) -> None:
    columns = {"event_time_ms": [NOW_MS, NOW_MS], "step": [1, 2], field: value}
    data = _columns("step", columns)
    with pytest.raises(DecodeError, match=rf"columns\.step\.{field}: expected a list"):
        decode_metric_batch(data)
    with pytest.raises(DecodeError):
        decode(data, MetricBatch)


@pytest.mark.parametrize("value", [np.inf, -np.inf])
def test_infinity_in_a_packed_column_is_refused_as_in_a_list(value) -> None:
    data = _columns("episode", {"event_time_ms": [NOW_MS], "episode_index": [0],
                                "length": [1], "reward": _packed([value])})
    with pytest.raises(DecodeError, match=r"columns\.episode\.reward: values must be finite"):
        decode_metric_batch(data)
    with pytest.raises(DecodeError, match="finite"):
        decode(data, MetricBatch)


def test_nan_in_a_packed_optional_column_is_still_null() -> None:
    data = _columns("step", {"event_time_ms": [NOW_MS], "step": [1],
                             "grad_norm": _packed([np.nan])})
    assert np.isnan(decode_metric_batch(data).frames["step"]["grad_norm"]).all()


WINDOW = EventTimeWindow(ttl_days=30, max_future_s=300)


def test_event_time_window_bounds_are_the_ttl_and_the_skew() -> None:
    assert WINDOW.bounds_ms(NOW_MS) == (NOW_MS - 30 * DAY_MS, NOW_MS + 300_000)
    inside = np.array([NOW_MS - 30 * DAY_MS, NOW_MS + 300_000])
    assert event_time_problem(inside, WINDOW, NOW_MS) is None
    assert "older than the store keeps (30 days)" in event_time_problem(
        np.array([0]), WINDOW, NOW_MS)
    assert "300 s in the future" in event_time_problem(
        np.array([NOW_MS + 300_001]), WINDOW, NOW_MS)


@pytest.mark.parametrize("time_ms, form", [(0, "columns"), (NOW_MS + DAY_MS, "columns"),
                                           (0, "samples"), (NOW_MS + DAY_MS, "samples")])
def test_samples_the_store_would_drop_are_refused_with_the_field(time_ms, form) -> None:
    if form == "columns":
        data = _columns("step", {"event_time_ms": [NOW_MS, time_ms], "step": [1, 2]})
    else:
        data = orjson.dumps({"identity": IDENTITY, "samples": [
            {"kind": "step", "event_time_ms": time_ms, "step": 1}]})
    decode_metric_batch(data)  # the model alone takes any time after 1970
    with pytest.raises(DecodeError, match=rf"{form}\.step\.event_time_ms: "):
        decode_metric_batch(data, WINDOW, NOW_MS)


def test_a_frame_that_does_not_fit_its_table_is_refused_and_nothing_is_added() -> None:
    good = decode_metric_batch(_columns("step", {"event_time_ms": [NOW_MS], "step": [1]}))
    builder = RawColumnsBuilder()
    bad = {"step": {**good.frames["step"], "step": np.array([[1, 2]])}}
    with pytest.raises(ValueError, match=r"columns\.step\.step"):
        builder.add(good.header, bad)
    builder.add(good.header, good.frames)
    assert builder.tables()["raw_step_messages"].num_rows == 1


def test_the_duplicate_key_is_the_batch_id_whatever_the_form() -> None:
    rows = decode(orjson.dumps({"identity": IDENTITY, "event_id": "batch-0001", "samples": [
        {"kind": "step", "event_time_ms": NOW_MS, "step": 1}]}), MetricBatch)
    columns = decode_metric_batch(orjson.dumps(
        {"identity": IDENTITY, "event_id": "batch-0001",
         "columns": {"step": {"event_time_ms": [NOW_MS], "step": [1]}}}))
    assert duplicate_key(rows) == duplicate_key(columns.header) == "batch-0001"

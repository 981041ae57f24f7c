"""The column-wise validator agrees with the pydantic models on what it accepts and refuses."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from dsec.bench.traces import (
    TraceIdentity,
    grad_norm_decay,
    leak_on_long_episodes,
    reward_variance_jump,
    training_batch,
)
from dsec.schemas import DecodeError, MetricBatch, decode, encode
from dsec.schemas.fast_decode import decode_metric_batch
from dsec.schemas.frames import batch_frames

IDENTITY = {"job_id": "j", "worker_id": "w", "node_id": "n"}


def _message(columns: dict) -> bytes:
    return orjson.dumps({"identity": IDENTITY, "columns": columns})


VALID = [
    training_batch(TraceIdentity(), 3, 50),
    leak_on_long_episodes(TraceIdentity(), 1e6, phase_s=2, phases=2)[1],
    reward_variance_jump(TraceIdentity(), 5, 10)[0],
    grad_norm_decay(TraceIdentity(), -0.1, 20)[0],
]


@pytest.mark.parametrize("batch", VALID)
def test_valid_batches_decode_to_the_same_frames(batch: MetricBatch) -> None:
    data = encode(batch)
    fast = decode_metric_batch(data)
    reference = batch_frames(decode(data, MetricBatch))
    assert fast.header.identity == batch.identity and fast.header.event_id == batch.event_id
    assert fast.frames.keys() == reference.keys()
    for kind, frame in reference.items():
        for name, column in frame.items():
            got = fast.frames[kind][name]
            if column.dtype == object:
                assert got.tolist() == column.tolist(), (kind, name)
            else:
                np.testing.assert_array_equal(got, column, err_msg=f"{kind}.{name}")


def test_row_batches_take_the_reference_path() -> None:
    data = orjson.dumps({"identity": IDENTITY, "samples": [
        {"kind": "episode", "event_time_ms": 1, "episode_index": 0, "reward": 3.0, "length": 7}]})
    decoded = decode_metric_batch(data)
    assert decoded.frames["episode"]["reward"].tolist() == [3.0]


INVALID = [
    (b"nope", "not JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (_message({"step": {"event_time_ms": [1], "step": [1, 2]}}), "equal lengths"),
    (_message({"step": {"event_time_ms": [1], "step": [-1]}}), "columns.step.step"),
    (_message({"step": {"event_time_ms": [1], "step": [1.5]}}), "fractional"),
    (_message({"step": {"event_time_ms": [1], "step": ["a"]}}), "columns.step.step"),
    (_message({"step": {"event_time_ms": [1], "step": [1], "grad_norm": [-2.0]}}), ">= 0"),
    (_message({"step": {"event_time_ms": [1], "step": [1], "bogus": [1]}}), "extra inputs"),
    (_message({"step": {"step": [1]}}), "event_time_ms"),
    (_message({"warp": {"event_time_ms": [1]}}), "unknown sample kind"),
    (_message({"episode": {"event_time_ms": [1], "episode_index": [0], "reward": [None],
                           "length": [1]}}), "null where a number is required"),
    (_message({"gpu": {"event_time_ms": [1], "gpu_uuid": ["bad uuid!"],
                       "memory_used_bytes": [1], "memory_total_bytes": [2]}}), "must match"),
    (_message({"gpu": {"event_time_ms": [1], "gpu_uuid": ["GPU-1"], "memory_used_bytes": [1],
                       "memory_total_bytes": [2], "utilisation_pct": [101.0]}}), "<= 100"),
    (_message({"recovery": {"event_time_ms": [1], "recovery_time_s": [1.0],
                            "source": ["magic"]}}), "expected one of"),
    (_message({"step": {"event_time_ms": [1], "step": [1], "loss_nonfinite": [2]}}),
     "booleans"),
    (orjson.dumps({"identity": {"job_id": "j"}, "columns": {}}), "identity"),
    (orjson.dumps({"identity": IDENTITY, "schema_version": 9}), "schema_version"),
]


@pytest.mark.parametrize(("data", "fragment"), INVALID)
def test_invalid_batches_are_refused_by_both(data: bytes, fragment: str) -> None:
    with pytest.raises(DecodeError) as fast:
        decode_metric_batch(data)
    assert fragment in fast.value.reason
    with pytest.raises(DecodeError):
        decode(data, MetricBatch)


@pytest.mark.parametrize("batch", VALID)
def test_packed_columns_decode_like_lists(batch: MetricBatch) -> None:
    from dsec.schemas.metrics import encode_packed

    packed = decode_metric_batch(encode_packed(batch))
    listed = decode_metric_batch(encode(batch))
    assert packed.frames.keys() == listed.frames.keys()
    for kind, frame in listed.frames.items():
        for name, column in frame.items():
            got = packed.frames[kind][name]
            if column.dtype == object:
                assert got.tolist() == column.tolist()
            else:
                np.testing.assert_array_equal(got, column, err_msg=f"{kind}.{name}")
    assert decode(encode_packed(batch), MetricBatch).rows() == decode(
        encode(batch), MetricBatch).rows()


def _packed(dtype: str, values) -> dict:
    import base64

    return {"dtype": dtype, "data": base64.b64encode(np.asarray(values, dtype=dtype).tobytes())
            .decode()}


PACKED_INVALID = [
    (_message({"step": {"event_time_ms": _packed("<i8", [1, 2]), "step": _packed("<i8", [1])}}),
     "equal lengths"),
    (_message({"step": {"event_time_ms": _packed("<i8", [1]), "step": _packed("<i8", [-1])}}),
     ">= 0"),
    (_message({"step": {"event_time_ms": _packed("<i8", [1]), "step": _packed("<f8", [1.0])}}),
     "packed dtype"),
    (_message({"step": {"event_time_ms": [1], "step": {"dtype": "<i8", "data": "%%%"}}}),
     "base64"),
    (_message({"step": {"event_time_ms": [1], "step": {"dtype": "<i8", "data": "AQAAAAAAAé="}}}),
     "base64"),
    (_message({"episode": {"event_time_ms": [1], "episode_index": [0],
                           "reward": _packed("<f8", [float("nan")]), "length": [1]}}),
     "null where a number is required"),
    (_message({"episode": {"event_time_ms": [1], "episode_index": [0], "reward": [1.0],
                           "length": [1], "termination_reason": _packed("<i8", [1])}}),
     "numeric column"),
]


@pytest.mark.parametrize(("data", "fragment"), PACKED_INVALID)
def test_invalid_packed_columns_are_refused_by_both(data: bytes, fragment: str) -> None:
    with pytest.raises(DecodeError) as fast:
        decode_metric_batch(data)
    assert fragment in fast.value.reason
    with pytest.raises(DecodeError):
        decode(data, MetricBatch)


@pytest.mark.parametrize("as_packed", [False, True])
def test_nulls_pass_the_bounds_and_values_beside_them_are_still_checked(as_packed: bool) -> None:
    def column(values: list) -> list | dict:
        return _packed("<f8", [float("nan") if v is None else v for v in values]) if as_packed \
            else values

    ok = _message({"step": {"event_time_ms": [1, 2, 3], "step": [1, 2, 3],
                            "grad_norm": column([None, 0.0, 2.5])}})
    assert np.isnan(decode_metric_batch(ok).frames["step"]["grad_norm"][0])
    decode(ok, MetricBatch)
    bad = _message({"step": {"event_time_ms": [1, 2, 3], "step": [1, 2, 3],
                             "grad_norm": column([None, -1.0, 2.5])}})
    with pytest.raises(DecodeError) as fast:
        decode_metric_batch(bad)
    assert ">= 0" in fast.value.reason
    with pytest.raises(DecodeError):
        decode(bad, MetricBatch)


def test_padding_after_a_complete_quantum_is_taken_as_the_model_takes_it() -> None:
    # Three int64 are 24 bytes, 32 characters without padding: the standard library ignores
    # an "=" after them where SIMD decoders refuse it, and the model's verdict is the rule.
    data = _packed("<i8", [4, 5, 6])["data"] + "="
    message = _message({"step": {"event_time_ms": [1, 2, 3],
                                 "step": {"dtype": "<i8", "data": data}}})
    assert decode_metric_batch(message).frames["step"]["step"].tolist() == [4, 5, 6]
    assert [row.step for row in decode(message, MetricBatch).rows()] == [4, 5, 6]


@pytest.mark.parametrize("length", [1, 32, 33, 200])
@pytest.mark.parametrize(("column", "values", "fragment"), [
    ("grad_norm", [-1.0], ">= 0"),
    ("grad_norm", [None, -1.0], ">= 0"),
    ("step", [-1], ">= 0"),
    ("grad_norm", [None], None),
    ("grad_norm", [0.0, 2.5], None),
])
def test_short_and_long_columns_meet_the_same_bounds(
        length: int, column: str, values: list, fragment: str | None) -> None:
    # Short columns are checked on Python numbers, long ones with numpy: both as the model.
    filler = {"grad_norm": 1.0, "step": 1}[column]
    cells = [filler] * max(0, length - len(values)) + values
    columns = {"event_time_ms": list(range(1, len(cells) + 1)), "step": [1] * len(cells)}
    _both_accept_or_refuse(_message({"step": {**columns, column: cells}}), fragment)


def _both_accept_or_refuse(message: bytes, fragment: str | None) -> None:
    """Both decoders accept the message where ``fragment`` is None; else both refuse it,
    the fast one with ``fragment`` in its reason."""
    if fragment is None:
        decode_metric_batch(message)
        decode(message, MetricBatch)
        return
    with pytest.raises(DecodeError) as fast:
        decode_metric_batch(message)
    assert fragment in fast.value.reason
    with pytest.raises(DecodeError):
        decode(message, MetricBatch)


@pytest.mark.parametrize(("column", "values"), [
    ("loss", [0.5, 1.5, -2.0]),
    ("loss", [1, 2.5]),  # an integer in a float column, as other encoders write 1.0
    ("loss", [True, 0.5]),
    ("loss", [None, 0.5]),
    ("step", [0, 2**63 - 1]),
    ("step", [2**63]),
    ("step", [1.0, 2]),
    ("step", [True]),
])
def test_short_columns_of_any_number_type_decode_as_the_model_reads_them(
        column: str, values: list) -> None:
    # Short columns whose values are all of the column's own type take a shorter way.
    cells = {"event_time_ms": list(range(1, len(values) + 1)), "step": [1] * len(values),
             column: values}
    message = _message({"step": cells})
    try:
        reference = batch_frames(decode(message, MetricBatch))["step"][column]
    except DecodeError:
        with pytest.raises(DecodeError, match=f"columns.step.{column}"):
            decode_metric_batch(message)
        return
    got = decode_metric_batch(message).frames["step"][column]
    assert got.dtype == reference.dtype
    np.testing.assert_array_equal(got, reference)


@pytest.mark.parametrize("length", [1, 32, 33, 200])
@pytest.mark.parametrize(("kind", "column", "values", "fragment"), [
    ("episode", "reward", [float("nan")], "null where a number is required"),
    ("episode", "reward", [float("inf"), float("nan")], "null where a number is required"),
    ("episode", "reward", [-float("inf")], "values must be finite"),
    ("step", "grad_norm", [float("nan"), float("inf")], "values must be finite"),
    ("step", "grad_norm", [float("nan"), -1.0], ">= 0"),
    ("step", "grad_norm", [float("nan")] * 33, None),
    ("step", "grad_norm", [0.0, 2.5], None),
])
def test_short_and_long_packed_float_columns_meet_the_same_rules(
        length: int, kind: str, column: str, values: list, fragment: str | None) -> None:
    # Long packed float columns are judged from their extremes, short ones value by value.
    cells = [1.0] * max(0, length - len(values)) + values
    n = len(cells)
    columns = {"event_time_ms": list(range(1, n + 1)), column: _packed("<f8", cells)}
    if kind == "step":
        columns["step"] = [1] * n
    else:
        columns |= {"episode_index": list(range(n)), "length": [1] * n}
    message = _message({kind: columns})
    _both_accept_or_refuse(message, fragment)
    if fragment is None:
        got = decode_metric_batch(message).frames[kind][column]
        np.testing.assert_array_equal(got, np.asarray(cells))

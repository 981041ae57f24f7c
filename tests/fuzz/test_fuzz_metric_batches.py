"""Metric batches from the wire, fuzzed: rows, columns and packed columns.

The column decoder and the pydantic models agree on every input; what they refuse they
refuse with the field named; what they accept, the sink's tables and the metrics job's
features take without raising, and decoding costs memory in proportion to the message.
The pinned examples are what the fuzzing found (each fixed in the decoders)."""

from __future__ import annotations

import base64
import tracemalloc

import numpy as np
import pytest
from fuzzing import fuzz
from hypothesis import example, given
from hypothesis import strategies as st

from dsec.bench.fuzz_inputs import metric_batches, metric_streams, to_json
from dsec.bench.fuzz_targets import NOW_MS, metric_batch, metric_stream
from dsec.schemas import DecodeError
from dsec.schemas.fast_decode import decode_metric_batch

IDENTITY = {"job_id": "j", "worker_id": "w", "node_id": "n"}


def _batch(**form: object) -> bytes:
    return to_json({"identity": IDENTITY, **form})  # any integer, where orjson stops at 64 bits


def _step_columns(**columns: object) -> bytes:
    return _batch(columns={"step": {"event_time_ms": [NOW_MS], "step": [1], **columns}})


@fuzz(400)
@given(metric_batches())
# An integer past int64 in a row: the models took it, and the frames raised OverflowError.
@example(_batch(samples=[{"kind": "step", "event_time_ms": NOW_MS, "step": 2**63}]))
# A number as a string: pydantic read "5" as 5, the column decoder refused it.
@example(_step_columns(step=["5"]))
@example(_step_columns(loss_nonfinite=["true"]))
# Python's "$" matches before a final newline: "GPU-1\n" passed the column decoder.
@example(_batch(columns={"gpu": {"event_time_ms": [NOW_MS], "gpu_uuid": ["GPU-1\n"],
                                 "memory_used_bytes": [1], "memory_total_bytes": [1]}}))
# A minimum length the column decoder did not check.
@example(_batch(columns={"runtime": {"event_time_ms": [NOW_MS], "runtime_type": [""],
                                     "concurrency": [1], "mean_call_latency_ms": [1.0],
                                     "function_calling": [True]}}))
# 2**64 read as a double, cast to int64: it wrapped to a negative number.
@example(_step_columns(step=[18446744073709551616]))
# Rows beside a kind with no samples: the empty frame broke the features (IndexError).
@example(_batch(columns={"recovery": {"event_time_ms": [], "recovery_time_s": []}},
                samples=[{"kind": "episode", "event_time_ms": NOW_MS, "episode_index": 0,
                          "reward": 1.0, "length": 3}]))
def test_every_batch_is_decoded_alike_or_refused_naming_the_field(data: bytes) -> None:
    metric_batch(data)


@fuzz(100)
@given(metric_streams())
def test_a_workers_messages_in_order_never_break_its_features(messages: list[bytes]) -> None:
    metric_stream(messages)


def _packed(values: np.ndarray) -> dict[str, str]:
    return {"dtype": values.dtype.str, "data": base64.b64encode(values.tobytes()).decode()}


def _large(form: str, n: int) -> bytes:
    times = np.arange(NOW_MS - n, NOW_MS, dtype="<i8")
    if form == "rows":
        return _batch(samples=[{"kind": "step", "event_time_ms": int(t), "step": i, "loss": 0.5}
                               for i, t in enumerate(times)])
    if form == "lists":
        return _step_columns(event_time_ms=times.tolist(), step=list(range(n)), loss=[0.5] * n)
    return _step_columns(event_time_ms=_packed(times), step=_packed(np.arange(n, dtype="<i8")),
                         loss=_packed(np.full(n, 0.5)))


# The parser's tree costs about 13 bytes per byte of JSON (yyjson sizes it from the input).
@pytest.mark.parametrize("form, bytes_per_input_byte", [
    ("rows", 40), ("lists", 30), ("packed", 20)])
@fuzz(3)
@given(n=st.integers(5_000, 20_000))
def test_decoding_costs_memory_in_proportion_to_the_message(form, bytes_per_input_byte,
                                                            n) -> None:
    data = _large(form, n)
    tracemalloc.start()
    try:
        decoded = decode_metric_batch(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoded.sample_count() == n
    assert peak <= bytes_per_input_byte * len(data) + (1 << 20), (peak, len(data))


def test_a_batch_past_the_sample_bound_is_refused_before_its_columns_are_read() -> None:
    n = 100_001
    data = _step_columns(event_time_ms=_packed(np.zeros(n, dtype="<i8")), step=[[0]] * 3)
    with pytest.raises(DecodeError, match=r"columns\.step\.event_time_ms: at most 100000"):
        decode_metric_batch(data)

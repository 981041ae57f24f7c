from __future__ import annotations

import numpy as np
import pytest

from dsec.actuators.snapshot_codec import (
    ChunkCodec,
    chunk_spans,
    content_hash,
    dequantise_int8,
    from_byte_planes,
    quantise_int8,
    to_byte_planes,
    xor_bytes,
)


def test_chunk_spans_cover_the_buffer_once() -> None:
    assert chunk_spans(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_spans(0, 4) == []
    with pytest.raises(ValueError):
        chunk_spans(10, 0)


def test_xor_is_its_own_inverse() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, 1000, dtype=np.uint8)
    b = rng.integers(0, 256, 1000, dtype=np.uint8)
    assert np.array_equal(xor_bytes(xor_bytes(a, b), b), a)
    assert not xor_bytes(a, a).any()


def test_byte_planes_round_trip_and_group_high_bytes() -> None:
    values = np.arange(8, dtype=np.float32)
    raw = values.view(np.uint8)
    planes = to_byte_planes(raw, 4)
    assert np.array_equal(from_byte_planes(planes, 4), raw)
    assert np.array_equal(planes[24:], raw.reshape(-1, 4)[:, 3])


def test_codec_round_trips_key_and_delta_chunks() -> None:
    rng = np.random.default_rng(1)
    before = rng.standard_normal(4096).astype(np.float32)
    after = before + np.float32(1e-4) * rng.standard_normal(4096).astype(np.float32)
    codec = ChunkCodec()
    key = codec.encode(before.view(np.uint8), None, 4)
    delta = codec.encode(after.view(np.uint8), before.view(np.uint8), 4)
    assert len(delta) < len(key)  # a small update leaves most high bytes equal
    restored = codec.decode(delta, before.view(np.uint8), 4, after.nbytes)
    assert np.array_equal(restored, after.view(np.uint8))
    assert content_hash(restored) == content_hash(after.view(np.uint8))


def test_int8_quantisation_records_its_true_error_bound() -> None:
    rng = np.random.default_rng(2)
    values = rng.standard_normal(10_000).astype(np.float32)
    quantised = quantise_int8(values, block_elems=1000)
    restored = dequantise_int8(quantised.values, quantised.scales, 1000)
    error = np.abs(restored - values).max()
    assert error == pytest.approx(quantised.max_abs_error)
    assert error <= quantised.scales.max() / 2 + 1e-7
    assert quantised.values.dtype == np.int8 and quantised.scales.size == 10


def test_int8_codes_are_delta_coded_by_wrapping_difference() -> None:
    from dsec.actuators.snapshot_codec import wrapping_difference, wrapping_sum

    before = np.array([7, -128, 127, 0], dtype=np.int8).view(np.uint8)
    after = np.array([8, 127, -128, 0], dtype=np.int8).view(np.uint8)
    difference = wrapping_difference(after, before)
    assert difference.tolist() == [1, 255, 1, 0]
    assert np.array_equal(wrapping_sum(difference, before), after)
    codec = ChunkCodec()
    stored = codec.encode(after, before, 1)
    assert np.array_equal(codec.decode(stored, before, 1, after.size), after)

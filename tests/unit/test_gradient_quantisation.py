"""Blockwise gradient quantisation and the byte arithmetic of the quantised all-reduce, as
pure functions (no process group)."""

from __future__ import annotations

import pytest
import torch

from dsec.actuators.gradient_quantisation import (
    QUANTISATION_BLOCK,
    dequantise_rows,
    pack_payload,
    payload_bytes,
    quantise_rows,
    unpack_payload,
)
from dsec.actuators.quantised_all_reduce import (
    chunk_columns,
    quantised_all_reduce_bytes,
    ring_all_reduce_bytes,
)


@pytest.mark.parametrize("bits", [8, 4])
def test_each_row_is_quantised_on_its_own(bits: int) -> None:
    torch.manual_seed(0)
    rows = torch.stack([torch.randn(300) * 100.0, torch.randn(300) * 1e-3])
    codes, scales = quantise_rows(rows, bits)
    assert scales.shape == (2, 2)  # 300 values: two blocks of 256 a row
    restored = dequantise_rows(codes, scales, bits, 300)
    step = scales.repeat_interleave(QUANTISATION_BLOCK, dim=1)[:, :300]
    assert bool(((restored - rows).abs() <= step / 2 + 1e-9).all())
    # the small row keeps its own scale: not rounded to zero beside the large one
    assert (restored[1] - rows[1]).norm() / rows[1].norm() < 0.2


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("columns", [1, 255, 256, 257, 289, 1001])
@pytest.mark.parametrize("count", [1, 3])  # one row: a group of one, or one chunk gathered
def test_payload_rows_carry_codes_and_scales_intact(bits: int, columns: int,
                                                    count: int) -> None:
    rows = torch.randn(count, columns)
    codes, scales = quantise_rows(rows, bits)
    payload = pack_payload(codes, scales)
    assert payload.dtype == torch.uint8
    assert payload.shape == (count, payload_bytes(columns, bits))
    got_codes, got_scales = unpack_payload(payload, bits, columns)
    assert torch.equal(got_codes, codes)
    assert torch.equal(got_scales, scales)


def test_a_ring_all_reduce_sends_twice_the_chunks_of_the_others() -> None:
    assert ring_all_reduce_bytes(1000, 1) == 0
    assert ring_all_reduce_bytes(1000, 2) == 1000
    assert ring_all_reduce_bytes(1000, 8) == 2 * 7 * 125


def test_chunks_cover_the_gradient() -> None:
    assert chunk_columns(10, 4) == 3
    assert chunk_columns(1, 8) == 1
    assert chunk_columns(1024, 4) == 256


@pytest.mark.parametrize("bits", [8, 4])
def test_quantised_all_reduce_bytes_do_not_grow_with_the_group(bits: int) -> None:
    numel = 1_500_000
    encoded = payload_bytes(numel, bits)
    ratios = []
    for world in (2, 4, 8, 16, 64, 256):
        sent = quantised_all_reduce_bytes(numel, world, bits)
        # per chunk, at most one partly filled block of scales and one padding value
        assert sent <= 2 * (encoded + world * 5)
        fp32 = ring_all_reduce_bytes(numel * 4, world)
        ratios.append(sent / fp32)
        # gathering every rank's whole quantised gradient: the scheme this replaces
        all_gather = (world - 1) * encoded
        assert sent <= all_gather or world == 2
    assert max(ratios) < (0.26 if bits == 8 else 0.131)
    assert max(ratios) - min(ratios) < 0.002  # the same share of fp32's bytes at any size

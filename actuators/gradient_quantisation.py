"""Blockwise quantisation of gradients: pure functions on torch tensors.

Every row is cut into blocks of ``QUANTISATION_BLOCK`` values; a block gets one float32
scale (its largest magnitude over the code's levels) and each value a symmetric code of
4 or 8 bits, stored offset so that it is unsigned, 4-bit codes packed two to a byte. A
payload row is a row's codes followed by its scales' bytes: what a rank sends for one
chunk of a gradient.

One scale per block, not per bucket: a bucket holds parameters of very different
gradient scales, and with 4 bits (7 levels a side) a single bucket-wide scale rounds most
of a gradient to zero, which stalls learning.
"""

from __future__ import annotations

from typing import Any

SCALE_BYTES = 4  # one float32 scale per block
QUANTISATION_BLOCK = 256


def quantise_levels(bits: int) -> int:
    """Largest magnitude of a symmetric ``bits``-bit code: 127 for 8, 7 for 4."""
    if bits not in (4, 8):
        raise ValueError("quantised gradients take 4 or 8 bits")
    return (1 << (bits - 1)) - 1


def scale_count(numel: int) -> int:
    return -(-numel // QUANTISATION_BLOCK)


def code_bytes(numel: int, bits: int) -> int:
    quantise_levels(bits)
    return numel if bits == 8 else (numel + 1) // 2


def payload_bytes(numel: int, bits: int) -> int:
    """Bytes of one payload row of ``numel`` values: codes and scales."""
    return code_bytes(numel, bits) + SCALE_BYTES * scale_count(numel)


def quantise_rows(rows: Any, bits: int) -> tuple[Any, Any]:
    """(uint8 codes ``[R, code_bytes(C)]``, float32 scales ``[R, scale_count(C)]``) of a
    ``[R, C]`` float tensor, each row quantised on its own."""
    import torch

    levels = quantise_levels(bits)
    count, columns = rows.shape
    blocks_per_row = scale_count(columns)
    padded = rows.new_zeros((count, blocks_per_row * QUANTISATION_BLOCK), dtype=torch.float32)
    padded[:, :columns] = rows
    blocks = padded.view(count, blocks_per_row, QUANTISATION_BLOCK)
    scales = blocks.abs().amax(dim=2).clamp_min(torch.finfo(torch.float32).tiny) / levels
    codes = blocks.mul_((1.0 / scales)[..., None]).round_().clamp_(-levels, levels)
    codes = codes.add_(levels).to(torch.uint8).view(count, -1)[:, :columns]
    if bits == 4:
        if columns % 2:
            codes = torch.cat([codes, codes.new_full((count, 1), levels)], dim=1)
        codes = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return codes.contiguous(), scales


def dequantise_rows(codes: Any, scales: Any, bits: int, columns: int) -> Any:
    """The float32 ``[R, columns]`` values that ``quantise_rows`` codes stand for."""
    import torch

    levels = quantise_levels(bits)
    if bits == 4:
        codes = torch.stack([codes & 0x0F, codes >> 4], dim=2).view(codes.shape[0], -1)
    count, blocks_per_row = scales.shape
    padded_columns = blocks_per_row * QUANTISATION_BLOCK
    values = codes.new_zeros((count, padded_columns), dtype=torch.float32)
    values[:, :columns] = codes[:, :columns]
    blocks = values.sub_(levels).view(count, blocks_per_row, QUANTISATION_BLOCK)
    return blocks.mul_(scales[..., None]).view(count, padded_columns)[:, :columns]


def quantise_gradient(values: Any, bits: int) -> tuple[Any, Any]:
    """(packed uint8 codes, float32 scale per block of ``QUANTISATION_BLOCK``) for a flat
    float tensor."""
    codes, scales = quantise_rows(values.detach().reshape(1, -1), bits)
    return codes[0], scales[0]


def dequantise_gradient(codes: Any, scale: Any, bits: int, numel: int) -> Any:
    return dequantise_rows(codes.view(1, -1), scale.view(1, -1), bits, numel)[0]


def pack_payload(codes: Any, scales: Any) -> Any:
    """One uint8 row per chunk: its codes, then its scales' bytes."""
    import torch

    scale_bytes = scales.contiguous().view(torch.uint8).view(scales.shape[0], -1)
    return torch.cat([codes, scale_bytes], dim=1)


def unpack_payload(payload: Any, bits: int, columns: int) -> tuple[Any, Any]:
    """(codes, scales) of ``pack_payload`` rows of ``columns`` values each."""
    import torch

    split = code_bytes(columns, bits)
    # a copy at offset 0: a float32 view needs its bytes aligned, which a slice at
    # ``split`` need not be (a single row's slice is contiguous, so contiguous() keeps it)
    scales = payload[:, split:].clone(memory_format=torch.contiguous_format)
    scales = scales.view(torch.float32)
    return payload[:, :split], scales

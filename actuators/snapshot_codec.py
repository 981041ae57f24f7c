"""Pure encoding math for incremental snapshots: chunks, hashes, XOR deltas, int8 quantisation.

Why XOR then byte planes then zstd: between two snapshots an Adam-updated float
keeps its sign, its exponent and the top of its mantissa; XOR turns those into
zero bits, and splitting the 4 bytes of every float32 into 4 planes puts the
zeroed high bytes next to each other, where zstd codes them in a few bits.
Quantised (int8) codes are subtracted instead, since a code that moved by one
step is then a small number rather than a run of flipped bits.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import zstandard

DEFAULT_CHUNK_BYTES = 1 << 20


def content_hash(raw: np.ndarray | bytes | memoryview) -> str:
    """blake2b-128 of the bytes: fast, and collision-free in practice for chunk identity."""
    return hashlib.blake2b(memoryview(raw).cast("B"), digest_size=16).hexdigest()


def chunk_spans(nbytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[tuple[int, int]]:
    """Byte ranges of the chunks of an ``nbytes`` buffer; the last may be short."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    return [(start, min(start + chunk_bytes, nbytes)) for start in range(0, nbytes, chunk_bytes)]


def xor_bytes(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Byte-wise XOR of two equally long uint8 buffers; its own inverse."""
    if left.shape != right.shape:
        raise ValueError(f"xor of {left.shape} against {right.shape}")
    return np.bitwise_xor(left, right)


def wrapping_difference(values: np.ndarray, base: np.ndarray) -> np.ndarray:
    """(values - base) mod 256, byte-wise: for int8 codes that moved by a step or two this
    is a small number, where XOR would flip several bits (7 -> 8 is 0x0F under XOR)."""
    if values.shape != base.shape:
        raise ValueError(f"difference of {values.shape} against {base.shape}")
    return np.subtract(values, base, dtype=np.uint8)


def wrapping_sum(difference: np.ndarray, base: np.ndarray) -> np.ndarray:
    return np.add(difference, base, dtype=np.uint8)


def to_byte_planes(raw: np.ndarray, itemsize: int) -> np.ndarray:
    """Regroups bytes so byte k of every element lies together (a lossless shuffle)."""
    if itemsize <= 1 or raw.size % itemsize:
        return raw
    return np.ascontiguousarray(raw.reshape(-1, itemsize).T).reshape(-1)


def from_byte_planes(planes: np.ndarray, itemsize: int) -> np.ndarray:
    if itemsize <= 1 or planes.size % itemsize:
        return planes
    return np.ascontiguousarray(planes.reshape(itemsize, -1).T).reshape(-1)


@dataclass(frozen=True)
class ChunkCodec:
    """How one chunk is turned into stored bytes, and back."""

    level: int = 3

    def encode(self, raw: np.ndarray, base: np.ndarray | None, itemsize: int) -> bytes:
        """Floats are XORed against ``base``; single-byte (int8) codes are subtracted."""
        if base is None:
            delta = raw
        elif itemsize == 1:
            delta = wrapping_difference(raw, base)
        else:
            delta = xor_bytes(raw, base)
        planes = to_byte_planes(delta, itemsize)
        return zstandard.ZstdCompressor(level=self.level).compress(planes.tobytes())

    def decode(
        self, stored: bytes, base: np.ndarray | None, itemsize: int, nbytes: int
    ) -> np.ndarray:
        planes = np.frombuffer(
            zstandard.ZstdDecompressor().decompress(stored, max_output_size=nbytes), np.uint8
        )
        if planes.size != nbytes:
            raise ValueError(f"chunk decoded to {planes.size} bytes, expected {nbytes}")
        delta = from_byte_planes(planes, itemsize)
        if base is None:
            return delta.copy()
        return wrapping_sum(delta, base) if itemsize == 1 else xor_bytes(delta, base)


@dataclass(frozen=True)
class Quantised:
    values: np.ndarray  # int8, one per element
    scales: np.ndarray  # float32, one per block
    block_elems: int
    max_abs_error: float


def quantise_int8(values: np.ndarray, block_elems: int = 4096) -> Quantised:
    """Symmetric absmax int8 per block; ``max_abs_error`` is the worst error actually made."""
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    if flat.size == 0:
        return Quantised(np.zeros(0, np.int8), np.zeros(0, np.float32), block_elems, 0.0)
    pad = (-flat.size) % block_elems
    blocks = np.pad(flat, (0, pad)).reshape(-1, block_elems)
    scales = (np.abs(blocks).max(axis=1) / 127.0).astype(np.float32)
    safe = np.where(scales > 0, scales, 1.0).astype(np.float32)
    quantised = np.clip(np.rint(blocks / safe[:, None]), -127, 127).astype(np.int8)
    restored = (quantised.astype(np.float32) * scales[:, None]).reshape(-1)[: flat.size]
    error = float(np.max(np.abs(restored - flat))) if flat.size else 0.0
    return Quantised(quantised.reshape(-1)[: flat.size], scales, block_elems, error)


def dequantise_int8(quantised: np.ndarray, scales: np.ndarray, block_elems: int) -> np.ndarray:
    flat = quantised.astype(np.float32).reshape(-1)
    pad = (-flat.size) % block_elems
    blocks = np.pad(flat, (0, pad)).reshape(-1, block_elems) * scales[:, None]
    return blocks.reshape(-1)[: flat.size]

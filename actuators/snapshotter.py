"""State snapshots: the training thread pays for a device-to-host copy, nothing else.

``request()`` at a step boundary starts the copy of every model and optimizer
tensor into reusable host buffers on a background thread, so the copy overlaps
the next forward and backward; ``wait_copied()`` (an optimizer step pre-hook)
holds the next optimizer step until the copy is done. Chunking, hashing, XOR
against the keyframe, compression and the atomic write all happen on
that background thread.

The state captured is consistent as long as parameters and optimizer state change
only inside ``optimizer.step()`` (the hooked step); a loop that edits parameters in
place elsewhere should call ``wait_copied()`` first.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dsec.actuators.snapshot_codec import (
    DEFAULT_CHUNK_BYTES,
    ChunkCodec,
    chunk_spans,
    content_hash,
    quantise_int8,
)
from dsec.actuators.snapshot_store import (
    ChunkRecord,
    Manifest,
    TensorRecord,
    fsync_dir,
    list_sequences,
    manifest_parent,
    manifest_path,
    pack_path,
    prune_before,
    resolve_directory,
    write_atomically,
)
from dsec.schemas import now_ms
from dsec.schemas.units import duration_ms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotConfig:
    directory: str | Path
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    zstd_level: int = 3
    keyframe_every: int = 64
    # a new keyframe once the deltas since the last one add up to this share of its size:
    # bounds the bytes a restore reads and verifies to (1 + delta_budget) keyframes
    delta_budget: float = 1.0
    # a changed chunk is XORed against the keyframe only when that makes it at least this
    # much smaller than the keyframe's copy; otherwise it is stored on its own
    xor_worth_ratio: float = 0.8
    keep_segments: int = 2  # keyframe segments kept on disk
    quantise_weights: bool = False  # int8 weights, with the error bound in the manifest
    # int8 Adam moments too (exp_avg as is, exp_avg_sq as its square root, whose range is
    # far narrower): lossy, bounded, and what it takes to make Adam's state compress
    quantise_optimizer: bool = False
    quantise_block_elems: int = 4096


@dataclass
class SnapshotStats:
    taken: int = 0
    skipped_busy: int = 0
    failed: int = 0
    blocking_ms_total: float = 0.0
    blocking_ms: list[float] = field(default_factory=list)  # per snapshot: call + copy wait
    last_seq: int | None = None
    last_bytes: int = 0
    last_encode_ms: float = 0.0
    written_bytes: list[int] = field(default_factory=list)
    keyframes: list[bool] = field(default_factory=list)  # parallel to written_bytes


def _tensor_bytes(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).view(np.uint8)


def capture_rng() -> tuple[dict[str, Any], dict[str, Any]]:
    """RNG states as (tensors, json meta)."""
    import torch

    tensors: dict[str, Any] = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{index}"] = state
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["rng.numpy.keys"] = torch.from_numpy(np.asarray(keys, dtype=np.uint32).copy())
    version, py_state, gauss = random.getstate()
    meta = {
        "numpy": [kind, int(pos), int(has_gauss), float(cached)],
        "python": [version, list(py_state), gauss],
    }
    return tensors, meta


class Snapshotter:
    def __init__(self, model: Any, optimizer: Any, config: SnapshotConfig) -> None:
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self.directory = resolve_directory(config.directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._buffers: dict[str, Any] = {}  # host copies, reused snapshot after snapshot
        existing = list_sequences(self.directory)
        self._next_seq = existing[-1] + 1 if existing else 0
        self._reset_chain()  # the first snapshot of a process is a keyframe
        self._copied = threading.Event()
        self._copied.set()
        self._idle = threading.Event()
        self._idle.set()
        self._error: BaseException | None = None
        self.stats = SnapshotStats()
        self._hook_handle: Any = None
        # one long-lived thread: starting a thread per snapshot costs the training thread
        # milliseconds of GIL hand-over on a busy host
        self._jobs: queue.SimpleQueue[tuple[int, dict, dict] | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._work, name="dsec-snapshot", daemon=True)
        self._worker.start()
        if optimizer is not None and hasattr(optimizer, "register_step_pre_hook"):
            self._hook_handle = optimizer.register_step_pre_hook(self._before_optimizer_step)
        self.prepare()

    def prepare(self) -> None:
        """Allocates the host buffers now rather than inside the first snapshot's copy
        (optimizer state that does not exist yet is allocated when it first appears)."""
        tensors, _ = self._collect()
        for name, tensor in tensors.items():
            self._host_buffer(name, tensor)

    def _reset_chain(self) -> None:
        self._key_seq: int | None = None
        self._key_raw: dict[str, np.ndarray] = {}  # stored bytes of the keyframe
        self._key_lengths: dict[str, list[int]] = {}  # its encoded chunk sizes
        self._key_bytes = 0
        self._latest: dict[str, list[ChunkRecord]] = {}  # where each chunk's bytes live now
        self._since_keyframe = 0
        self._delta_bytes_since_key = 0

    # --- training thread -------------------------------------------------------------

    def busy(self) -> bool:
        return not self._idle.is_set()

    def request(self, global_step: int, extra: dict[str, Any] | None = None,
                compression_level: int | None = None) -> int | None:
        """Starts a snapshot of the state at this step boundary; None when one is in flight.
        ``compression_level``: the zstd level of its new chunks (default: the config's); its
        manifest records the level it was written at."""
        started = time.perf_counter()
        if self.busy():
            self.stats.skipped_busy += 1
            return None
        self._idle.clear()
        self._copied.clear()
        seq = self._next_seq
        self._next_seq += 1
        try:
            tensors, meta = self._collect()
        except BaseException:
            self._copied.set()
            self._idle.set()
            raise
        meta.update(extra or {})
        meta["global_step"] = int(global_step)
        meta["compression_level"] = int(compression_level or self.config.zstd_level)
        self._jobs.put((seq, tensors, meta))
        elapsed_ms = duration_ms(time.perf_counter() - started)
        self.stats.blocking_ms_total += elapsed_ms
        self.stats.blocking_ms.append(elapsed_ms)
        return seq

    def _before_optimizer_step(self, *_args: Any) -> None:
        self.wait_copied()

    def wait_copied(self) -> float:
        """Blocks until the host copy is complete; returns the milliseconds waited."""
        if self._copied.is_set():
            return 0.0
        started = time.perf_counter()
        self._copied.wait()
        waited_ms = duration_ms(time.perf_counter() - started)
        self.stats.blocking_ms_total += waited_ms
        if self.stats.blocking_ms:
            self.stats.blocking_ms[-1] += waited_ms
        return waited_ms

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        return self._idle.wait(timeout_s)

    def _collect(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        if self.model is not None:
            for name, tensor in self.model.state_dict().items():
                tensors[f"model.{name}"] = tensor.detach()
        if self.optimizer is not None:
            state_dict = self.optimizer.state_dict()
            scalars: dict[str, dict[str, Any]] = {}
            for index, values in state_dict["state"].items():
                for key, value in values.items():
                    if hasattr(value, "detach"):
                        tensors[f"optim.{index}.{key}"] = value.detach()
                    else:
                        scalars.setdefault(str(index), {})[key] = value
            meta["optim_param_groups"] = state_dict["param_groups"]
            meta["optim_scalars"] = scalars
        rng_tensors, rng_meta = capture_rng()
        tensors.update(rng_tensors)
        meta["rng"] = rng_meta
        return tensors, meta

    # --- background thread -----------------------------------------------------------

    def _host_buffer(self, name: str, tensor: Any) -> Any:
        import torch

        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(
                tensor.shape, dtype=tensor.dtype, device="cpu",
                pin_memory=tensor.is_cuda and torch.cuda.is_available(),
            )
            self._buffers[name] = buffer
        return buffer

    def _copy(self, tensors: dict[str, Any]) -> dict[str, np.ndarray]:
        import torch

        arrays: dict[str, np.ndarray] = {}
        with torch.no_grad():
            for name, tensor in tensors.items():
                buffer = self._host_buffer(name, tensor)
                buffer.copy_(tensor, non_blocking=tensor.is_cuda)
                arrays[name] = buffer
            if any(t.is_cuda for t in tensors.values()):
                torch.cuda.synchronize()
        # bf16 has no numpy dtype; its bytes travel as int16
        return {
            name: (b.view(torch.int16) if b.dtype == torch.bfloat16 else b).numpy()
            for name, b in arrays.items()
        }

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._run(*job)

    def _run(self, seq: int, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
        try:
            arrays = self._copy(tensors)
        except BaseException as exc:
            self._copied.set()
            self._fail(seq, exc)
            return
        self._copied.set()
        try:
            started = time.perf_counter()
            torch_dtypes = {n: str(t.dtype).removeprefix("torch.") for n, t in tensors.items()}
            codec = ChunkCodec(meta["compression_level"])
            written = self._encode_and_write(seq, arrays, meta, torch_dtypes, codec)
            self.stats.last_encode_ms = duration_ms(time.perf_counter() - started)
            self.stats.taken += 1
            self.stats.last_seq = seq
            self.stats.last_bytes = written
            self.stats.written_bytes.append(written)
        except BaseException as exc:
            self._fail(seq, exc)
        finally:
            self._idle.set()

    def _fail(self, seq: int, exc: BaseException) -> None:
        self.stats.failed += 1
        self._error = exc
        self._reset_chain()  # the next snapshot must not build on a missing link
        self._idle.set()
        log.error("dsec snapshot %d failed: %s", seq, exc)

    def _stored_entries(
        self, arrays: dict[str, np.ndarray]
    ) -> list[tuple[np.ndarray, TensorRecord]]:
        entries: list[tuple[np.ndarray, TensorRecord]] = []
        for name, array in arrays.items():
            transform = self._quantisation(name, array)
            if transform is not None:
                source = np.sqrt(np.maximum(array, 0)) if transform == "sqrt" else array
                quantised = quantise_int8(source, self.config.quantise_block_elems)
                entries.append((quantised.values, TensorRecord(
                    name=name, dtype="int8", shape=list(array.shape), chunks=[],
                    quantised_from="float32", block_elems=quantised.block_elems,
                    max_abs_error=quantised.max_abs_error, transform=transform,
                )))
                scales = quantised.scales
                entries.append((scales, TensorRecord(
                    name=f"{name}#scales", dtype="float32", shape=list(scales.shape), chunks=[]
                )))
            else:
                entries.append((array, TensorRecord(
                    name=name, dtype=array.dtype.name, shape=list(array.shape), chunks=[]
                )))
        return entries

    def _quantisation(self, name: str, array: np.ndarray) -> str | None:
        """None: stored exactly; "": int8; "sqrt": int8 of the square root."""
        if array.dtype != np.float32 or array.size < 1024:
            return None
        if self.config.quantise_weights and name.startswith("model."):
            return ""
        if self.config.quantise_optimizer and name.startswith("optim."):
            if name.endswith(".exp_avg_sq"):
                return "sqrt"
            if name.endswith(".exp_avg"):
                return ""
        return None

    def _encode_and_write(
        self, seq: int, arrays: dict[str, np.ndarray], meta: dict, torch_dtypes: dict[str, str],
        codec: ChunkCodec,
    ) -> int:
        keyframe = (
            self._key_seq is None
            or self._since_keyframe >= self.config.keyframe_every
            or self._delta_bytes_since_key >= self.config.delta_budget * self._key_bytes
        )
        key_seq = seq if keyframe else self._key_seq
        pieces: list[bytes] = []
        offset = 0
        records: list[TensorRecord] = []
        key_raw: dict[str, np.ndarray] = {}
        key_lengths: dict[str, list[int]] = {}
        latest: dict[str, list[ChunkRecord]] = {}
        for stored, record in self._stored_entries(arrays):
            name = record.name
            record.torch_dtype = torch_dtypes.get(name, "")
            raw = _tensor_bytes(np.ascontiguousarray(stored))
            key = None if keyframe else self._key_raw.get(name)
            if key is not None and key.size != raw.size:
                key = None
            before = self._latest.get(name, []) if key is not None else []
            itemsize = stored.dtype.itemsize
            for index, (start, end) in enumerate(chunk_spans(raw.size, self.config.chunk_bytes)):
                piece = raw[start:end]
                digest = content_hash(piece)
                if index < len(before) and before[index].hash == digest:
                    record.chunks.append(before[index])  # unchanged: a reference, no bytes
                    continue
                key_chunk = None if key is None else key[start:end]
                encoded = codec.encode(piece, key_chunk, itemsize)
                mode = "key" if key_chunk is None else "xor"
                key_sizes = self._key_lengths.get(name, [])
                if (mode == "xor" and index < len(key_sizes)
                        and len(encoded) > self.config.xor_worth_ratio * key_sizes[index]):
                    # XOR barely helps (e.g. lossless Adam moments): storing the chunk on
                    # its own costs a little size and halves what a restore decodes
                    encoded = codec.encode(piece, None, itemsize)
                    mode = "key"
                record.chunks.append(ChunkRecord(
                    end - start, digest, offset, len(encoded), mode, seq,
                ))
                pieces.append(encoded)
                offset += len(encoded)
            records.append(record)
            latest[name] = record.chunks
            if keyframe:
                key_raw[name] = raw.copy()
                key_lengths[name] = [chunk.length for chunk in record.chunks]
        pack_hash = hashlib.blake2b(digest_size=16)
        for piece in pieces:
            pack_hash.update(piece)
        manifest = Manifest(
            seq=seq, parent=None if keyframe else seq - 1, keyframe=key_seq,
            created_ms=now_ms(), meta=meta, tensors=records, pack_bytes=offset,
            pack_hash=pack_hash.hexdigest(),
        )
        write_atomically(pack_path(self.directory, seq), pieces)
        manifest_bytes = manifest.to_bytes()
        write_atomically(manifest_path(self.directory, seq), manifest_bytes)
        fsync_dir(self.directory)
        self._latest = latest
        self.stats.keyframes.append(keyframe)
        if keyframe:
            self._key_seq = seq
            self._key_raw = key_raw
            self._key_lengths = key_lengths
            self._key_bytes = offset
            self._since_keyframe = 1
            self._delta_bytes_since_key = 0
            self._prune(seq)
        else:
            self._since_keyframe += 1
            self._delta_bytes_since_key += offset
        return offset + len(manifest_bytes)

    def _prune(self, keyframe_seq: int) -> None:
        keyframes = []
        for seq in list_sequences(self.directory):
            try:
                if manifest_parent(self.directory, seq) is None:
                    keyframes.append(seq)
            except (OSError, ValueError):
                continue
        older = [seq for seq in keyframes if seq <= keyframe_seq]
        if len(older) > self.config.keep_segments:
            prune_before(self.directory, older[-self.config.keep_segments])

    def close(self, timeout_s: float = 60.0) -> None:
        self.wait_idle(timeout_s)
        if self._worker.is_alive():
            self._jobs.put(None)
            self._worker.join(timeout_s)
        if self._hook_handle is not None:
            self._hook_handle.remove()
            self._hook_handle = None


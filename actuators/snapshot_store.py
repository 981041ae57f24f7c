"""Snapshot chains on a local directory: atomic writes, and verified reads back.

One snapshot is two files: ``snap-<seq>.pack`` (the encoded chunks, back to back)
and ``snap-<seq>.json`` (the manifest: tensors, chunks, hashes, parent, keyframe).
The manifest is written last and atomically, so a snapshot exists only once all
of its bytes are durable.

A keyframe stores every chunk. A delta stores a chunk only when its content hash
changed since the snapshot before it, XORed against the same chunk of the
keyframe (or on its own, when XOR does not make it smaller); an unchanged chunk
is a reference to the snapshot that stored it.
Deltas reference the keyframe rather than their parent so that restoring any
snapshot decodes each chunk at most twice (keyframe + latest change), however
long the chain: restore time stays bounded while writes stay incremental.
"""

from __future__ import annotations

import mmap
import os
import re
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import orjson

from dsec.actuators.snapshot_codec import ChunkCodec, content_hash

MANIFEST_VERSION = 1
_MANIFEST = re.compile(r"^snap-(\d{8})\.json$")


def resolve_directory(location: str | os.PathLike[str]) -> Path:
    """A local path or a ``file://`` URL; other schemes need an object-store backend."""
    text = os.fspath(location)
    parsed = urlparse(text)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else text)
    if len(parsed.scheme) == 1:  # a Windows drive letter, not a scheme
        return Path(text)
    raise ValueError(f"unsupported snapshot location {text!r}: use a path or file:// URL")


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, chunks: list[bytes] | bytes) -> int:
    """Writes, fsyncs and renames into place; returns the bytes written."""
    parts = [chunks] if isinstance(chunks, bytes) else chunks
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    written = 0
    try:
        with os.fdopen(fd, "wb") as handle:
            for part in parts:
                handle.write(part)
                written += len(part)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return written


def manifest_path(directory: Path, seq: int) -> Path:
    return directory / f"snap-{seq:08d}.json"


def pack_path(directory: Path, seq: int) -> Path:
    return directory / f"snap-{seq:08d}.pack"


def manifest_parent(directory: Path, seq: int) -> int | None:
    return orjson.loads(manifest_path(directory, seq).read_bytes()).get("parent")


def list_sequences(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    found = (_MANIFEST.match(entry.name) for entry in directory.iterdir())
    return sorted(int(match.group(1)) for match in found if match)


@dataclass
class ChunkRecord:
    nbytes: int
    hash: str
    offset: int = 0  # in the pack of ``stored_in``
    length: int = 0
    mode: str = "key"  # key: raw; xor: XORed against the keyframe's chunk
    stored_in: int = -1  # the snapshot whose pack holds these bytes


@dataclass
class TensorRecord:
    name: str
    dtype: str  # numpy dtype name of the stored bytes
    shape: list[int]
    chunks: list[ChunkRecord]
    torch_dtype: str = ""  # e.g. bfloat16, which numpy stores as int16
    quantised_from: str | None = None  # the original dtype, when int8-quantised
    transform: str = ""  # applied before quantising: "" or "sqrt" (squared on restore)
    block_elems: int = 0
    max_abs_error: float = 0.0  # of the quantised values (after ``transform``)


@dataclass
class Manifest:
    seq: int
    parent: int | None
    keyframe: int
    created_ms: int
    meta: dict
    tensors: list[TensorRecord] = field(default_factory=list)
    pack_bytes: int = 0
    pack_hash: str = ""
    version: int = MANIFEST_VERSION

    def to_bytes(self) -> bytes:
        return orjson.dumps(self, option=orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        raw = orjson.loads(data)
        if raw.get("version") != MANIFEST_VERSION:
            raise ValueError(f"unknown manifest version {raw.get('version')!r}")
        tensors = [
            TensorRecord(**{**t, "chunks": [ChunkRecord(**c) for c in t["chunks"]]})
            for t in raw.pop("tensors")
        ]
        return cls(**raw, tensors=tensors)


class CorruptSnapshotError(ValueError):
    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(f"snapshot {seq}: {reason}")
        self.seq = seq
        self.reason = reason


def read_manifest(directory: Path, seq: int) -> Manifest:
    try:
        manifest = Manifest.from_bytes(manifest_path(directory, seq).read_bytes())
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise CorruptSnapshotError(seq, f"unreadable manifest: {exc}") from None
    if manifest.seq != seq:
        raise CorruptSnapshotError(seq, f"manifest says seq {manifest.seq}")
    return manifest


def _map_file(path: Path) -> memoryview:
    """The file's bytes without copying them out of the page cache."""
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return memoryview(b"")
        return memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))


class _Packs:
    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._cache: dict[int, memoryview] = {}
        self._lock = threading.Lock()

    def read(self, seq: int, manifest_bytes: int) -> memoryview:
        with self._lock:
            return self._read(seq, manifest_bytes)

    def _read(self, seq: int, manifest_bytes: int) -> memoryview:
        if seq not in self._cache:
            try:
                pack = _map_file(pack_path(self._directory, seq))
            except OSError as exc:
                raise CorruptSnapshotError(seq, f"unreadable pack: {exc}") from None
            if len(pack) != manifest_bytes:
                raise CorruptSnapshotError(
                    seq, f"pack has {len(pack)} bytes, manifest says {manifest_bytes}"
                )
            self._cache[seq] = pack
        return self._cache[seq]


def _decode_chunk(
    chunk: ChunkRecord, key_chunk: np.ndarray | None, itemsize: int,
    manifests: dict[int, Manifest], packs: _Packs, codec: ChunkCodec, where: str,
) -> np.ndarray:
    holder = manifests.get(chunk.stored_in)
    if holder is None:
        raise CorruptSnapshotError(chunk.stored_in, f"{where}: snapshot missing")
    if chunk.mode == "xor" and key_chunk is None:
        raise CorruptSnapshotError(holder.seq, f"{where}: keyframe lacks this chunk")
    pack = packs.read(holder.seq, holder.pack_bytes)
    stored = pack[chunk.offset : chunk.offset + chunk.length]
    try:
        raw = codec.decode(stored, key_chunk if chunk.mode == "xor" else None, itemsize,
                           chunk.nbytes)
    except Exception as exc:
        raise CorruptSnapshotError(holder.seq, f"{where}: {exc}") from None
    if content_hash(raw) != chunk.hash:
        raise CorruptSnapshotError(holder.seq, f"{where}: content hash mismatch")
    return raw


def build_state(
    manifest: Manifest, manifests: dict[int, Manifest], packs: _Packs, codec: ChunkCodec,
    decode_threads: int = 4,
) -> dict[str, np.ndarray]:
    """The byte buffers of ``manifest``, every chunk checked against its content hash.

    A keyframe chunk is decoded only where a delta chunk is XORed against it. Chunks
    decode on a few threads: zstd, numpy and hashlib release the GIL.
    """
    key_manifest = manifests.get(manifest.keyframe)
    if key_manifest is None:
        raise CorruptSnapshotError(manifest.keyframe, "keyframe missing")
    key_tensors = {tensor.name: tensor for tensor in key_manifest.tensors}
    result: dict[str, np.ndarray] = {}
    Job = tuple[np.ndarray, slice, ChunkRecord, ChunkRecord | None, int, str]
    jobs: list[Job] = []
    for tensor in manifest.tensors:
        itemsize = np.dtype(tensor.dtype).itemsize
        buffer = np.empty(sum(chunk.nbytes for chunk in tensor.chunks), np.uint8)
        key_tensor = key_tensors.get(tensor.name)
        position = 0
        for index, chunk in enumerate(tensor.chunks):
            span = slice(position, position + chunk.nbytes)
            position += chunk.nbytes
            key_chunk = None
            if chunk.mode == "xor":
                if key_tensor is None or index >= len(key_tensor.chunks):
                    raise CorruptSnapshotError(manifest.seq,
                                               f"{tensor.name}: keyframe lacks this chunk")
                key_chunk = key_tensor.chunks[index]
            jobs.append((buffer, span, chunk, key_chunk, itemsize,
                         f"{tensor.name} chunk {index}"))
        result[tensor.name] = buffer

    def decode(job: Job) -> None:
        buffer, span, chunk, key_chunk, itemsize, where = job
        base = None
        if key_chunk is not None:
            base = _decode_chunk(key_chunk, None, itemsize, manifests, packs, codec, where)
        buffer[span] = _decode_chunk(chunk, base, itemsize, manifests, packs, codec, where)

    if decode_threads <= 1 or len(jobs) < 2:
        for job in jobs:
            decode(job)
        return result
    with ThreadPoolExecutor(max_workers=decode_threads, thread_name_prefix="dsec-restore") as pool:
        for _ in pool.map(decode, jobs):
            pass
    return result


@dataclass
class ChainReport:
    restored_seq: int | None
    applied: list[int]
    corrupt: list[tuple[int, str]]


def _verify_link(directory: Path, manifest: Manifest, packs: _Packs) -> None:
    pack = packs.read(manifest.seq, manifest.pack_bytes)
    if content_hash(pack) != manifest.pack_hash:
        raise CorruptSnapshotError(manifest.seq, "pack hash mismatch")


def read_chain(
    directory: Path, codec: ChunkCodec | None = None
) -> tuple[Manifest | None, dict[str, np.ndarray], ChainReport]:
    """The newest state whose chain verifies.

    Every link from the newest keyframe on is checked (manifest, pack hash, parent);
    the first corrupt link ends the chain and the snapshot before it is restored. A
    corrupt keyframe falls back to the keyframe before it, when one is kept.
    """
    codec = codec or ChunkCodec()
    corrupt: list[tuple[int, str]] = []
    manifests: dict[int, Manifest] = {}
    for seq in list_sequences(directory):
        try:
            manifests[seq] = read_manifest(directory, seq)
        except CorruptSnapshotError as exc:
            corrupt.append((seq, exc.reason))
    packs = _Packs(directory)
    keyframes = sorted((s for s, m in manifests.items() if m.parent is None), reverse=True)
    for keyframe in keyframes:
        good: list[Manifest] = []
        expected_parent: int | None = None
        for seq in range(keyframe, max(manifests) + 1):
            manifest = manifests.get(seq)
            if manifest is None:
                if seq not in {s for s, _ in corrupt}:
                    corrupt.append((seq, "missing from the chain"))
                break
            if seq != keyframe and (manifest.parent is None or manifest.keyframe != keyframe):
                break  # the next segment
            if manifest.parent != expected_parent:
                corrupt.append((seq, f"parent {manifest.parent}, expected {expected_parent}"))
                break
            good.append(manifest)
            expected_parent = seq
        # the keyframe and the newest link are decoded, and every chunk's hash checked;
        # the links in between are checked by their pack hashes
        for position, manifest in enumerate(good[1:-1], start=1):
            try:
                _verify_link(directory, manifest, packs)
            except CorruptSnapshotError as exc:
                corrupt.append((exc.seq, exc.reason))
                good = good[:position]
                break
        while good:
            chosen = good[-1]
            try:
                state = build_state(chosen, manifests, packs, codec)
            except CorruptSnapshotError as exc:
                corrupt.append((exc.seq, exc.reason))
                good = [m for m in good if m.seq < exc.seq]
                continue
            chain = [m.seq for m in good]
            return chosen, state, ChainReport(chosen.seq, chain, sorted(set(corrupt)))
    return None, {}, ChainReport(None, [], sorted(set(corrupt)))


def prune_before(directory: Path, seq: int) -> int:
    """Removes the snapshots older than ``seq``; returns how many."""
    removed = 0
    for old in list_sequences(directory):
        if old < seq:
            manifest_path(directory, old).unlink(missing_ok=True)
            pack_path(directory, old).unlink(missing_ok=True)
            removed += 1
    return removed

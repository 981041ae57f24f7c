"""Snapshot chains on a local directory: atomic writes, and verified reads back.

One snapshot is two files: ``snap-<seq>.pack`` (the encoded chunks, back to back)
and ``snap-<seq>.json`` (the manifest: tensors, chunks, hashes, parent). The
manifest is written last and atomically, so a snapshot exists only once all of
its bytes are durable. A keyframe has no parent; a delta stores each changed
chunk XORed against the same chunk of its parent, and nothing for an unchanged one.
"""

from __future__ import annotations

import os
import re
import tempfile
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
    offset: int = 0  # in the pack
    length: int = 0  # stored bytes; 0 when unchanged
    mode: str = "key"  # key | xor | same


@dataclass
class TensorRecord:
    name: str
    dtype: str  # numpy dtype name of the stored bytes
    shape: list[int]
    chunks: list[ChunkRecord]
    torch_dtype: str = ""  # e.g. bfloat16, which numpy stores as int16
    quantised_from: str | None = None  # the original dtype, when int8-quantised
    block_elems: int = 0
    max_abs_error: float = 0.0


@dataclass
class Manifest:
    seq: int
    parent: int | None
    created_ms: int
    meta: dict
    tensors: list[TensorRecord] = field(default_factory=list)
    pack_bytes: int = 0
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


def apply_snapshot(
    directory: Path, manifest: Manifest, state: dict[str, np.ndarray], codec: ChunkCodec
) -> dict[str, np.ndarray]:
    """The byte buffers after ``manifest``, given those after its parent (``state``).

    Every chunk is checked against its content hash; ``state`` is never modified, so a
    corrupt link leaves the last good state intact.
    """
    try:
        pack = pack_path(directory, manifest.seq).read_bytes()
    except OSError as exc:
        raise CorruptSnapshotError(manifest.seq, f"unreadable pack: {exc}") from None
    if len(pack) != manifest.pack_bytes:
        raise CorruptSnapshotError(
            manifest.seq, f"pack has {len(pack)} bytes, manifest says {manifest.pack_bytes}"
        )
    result: dict[str, np.ndarray] = {}
    for tensor in manifest.tensors:
        itemsize = np.dtype(tensor.dtype).itemsize
        total = sum(chunk.nbytes for chunk in tensor.chunks)
        previous = state.get(tensor.name)
        if previous is not None and previous.size != total:
            previous = None
        buffer = np.empty(total, np.uint8)
        position = 0
        for index, chunk in enumerate(tensor.chunks):
            span = slice(position, position + chunk.nbytes)
            position += chunk.nbytes
            where = f"{tensor.name} chunk {index}"
            if chunk.mode != "key" and previous is None:
                raise CorruptSnapshotError(manifest.seq, f"{where}: parent lacks this tensor")
            if chunk.mode == "same":
                buffer[span] = previous[span]  # type: ignore[index]
            else:
                stored = pack[chunk.offset : chunk.offset + chunk.length]
                base = None if chunk.mode == "key" else previous[span]  # type: ignore[index]
                try:
                    buffer[span] = codec.decode(stored, base, itemsize, chunk.nbytes)
                except Exception as exc:
                    raise CorruptSnapshotError(manifest.seq, f"{where}: {exc}") from None
            if content_hash(buffer[span]) != chunk.hash:
                raise CorruptSnapshotError(manifest.seq, f"{where}: content hash mismatch")
        result[tensor.name] = buffer
    return result


@dataclass
class ChainReport:
    restored_seq: int | None
    applied: list[int]
    corrupt: list[tuple[int, str]]


def read_chain(
    directory: Path, codec: ChunkCodec | None = None
) -> tuple[Manifest | None, dict[str, np.ndarray], ChainReport]:
    """The newest state that verifies: from the newest keyframe forward, falling back to an
    older keyframe only when the newer one is itself corrupt."""
    codec = codec or ChunkCodec()
    sequences = list_sequences(directory)
    corrupt: list[tuple[int, str]] = []
    manifests: dict[int, Manifest] = {}
    for seq in sequences:
        try:
            manifests[seq] = read_manifest(directory, seq)
        except CorruptSnapshotError as exc:
            corrupt.append((seq, exc.reason))
    keyframes = [seq for seq, m in manifests.items() if m.parent is None]
    for key_seq in sorted(keyframes, reverse=True):
        state: dict[str, np.ndarray] = {}
        last: Manifest | None = None
        applied: list[int] = []
        for seq in sorted(s for s in manifests if s >= key_seq):
            manifest = manifests[seq]
            if seq != key_seq and manifest.parent != (last.seq if last else None):
                if manifest.parent is None:
                    break  # the next keyframe's segment was tried already
                corrupt.append((seq, f"parent {manifest.parent} is not the last good link"))
                break
            try:
                state = apply_snapshot(directory, manifest, state, codec)
            except CorruptSnapshotError as exc:
                corrupt.append((exc.seq, exc.reason))
                break
            last = manifest
            applied.append(seq)
        if last is not None:
            return last, state, ChainReport(last.seq, applied, sorted(set(corrupt)))
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

"""Metric batches → one Arrow table per sample kind, for column-wise inserts.

A batch's identity is stored once per message and referenced by dictionary indices,
so the per-sample cost is that of numpy concatenation. A row does not carry its message's
id (a random id per message would cost more bytes on disk than the sample's values): a
sample is named by its worker, its time and ``seq``, its place among its message's samples
of its kind, from 0. Each message's rows of a kind are contiguous in a table, so
``message_ids()`` maps a run of rows back to its message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from dsec.schemas import MetricBatch
from dsec.schemas.frames import FIELD_DTYPES, Frame

IDENTITY_COLUMNS = ("job_id", "node_id", "worker_id")


def raw_table_name(kind: str) -> str:
    return f"raw_{kind}"


@dataclass
class _KindBuffer:
    columns: dict[str, list[np.ndarray]] = field(default_factory=dict)
    identity_index: list[np.ndarray] = field(default_factory=list)
    seq: list[np.ndarray] = field(default_factory=list)
    batch_gpu: list[np.ndarray] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)  # one per run of rows, in order


def _dictionary(message_values: list[str], message_of_row: np.ndarray) -> pa.DictionaryArray:
    """A string column with one entry per distinct value (Arrow dictionaries must not repeat)."""
    distinct, message_to_distinct = np.unique(np.asarray(message_values, dtype=object),
                                              return_inverse=True)
    indices = message_to_distinct.astype(np.int32)[message_of_row]
    return pa.DictionaryArray.from_arrays(pa.array(indices), pa.array(distinct.tolist()))


def frame_problem(kind: str, frame: Frame) -> None:
    """Raises ``ValueError`` naming the column where ``frame`` does not fit its raw table."""
    fields = FIELD_DTYPES.get(kind)
    if fields is None:
        raise ValueError(f"{kind}: unknown sample kind")
    n = frame["event_time_ms"].size if "event_time_ms" in frame else -1
    for name in fields:
        column = frame.get(name)
        if column is None or column.ndim != 1 or column.size != n:
            raise ValueError(f"columns.{kind}.{name}: expected one value per sample")


class RawColumnsBuilder:
    """Collects the frames of many batches; ``tables()`` gives one Arrow table per kind."""

    def __init__(self) -> None:
        self._identities: list[tuple[str, str, str]] = []
        self._batch_gpus: list[str] = []
        self._kinds: dict[str, _KindBuffer] = {}
        self.samples = 0

    def add(self, batch: MetricBatch, frames: dict[str, Frame]) -> None:
        """Adds one batch's frames; ``ValueError``, and nothing added, where a frame is not
        one flat column per field of its kind with one value per sample."""
        for kind, frame in frames.items():
            frame_problem(kind, frame)
        index = len(self._identities)
        identity = batch.identity
        self._identities.append((identity.job_id, identity.node_id, identity.worker_id))
        self._batch_gpus.append(batch.gpu_uuid or "")
        for kind, frame in frames.items():
            n = frame["event_time_ms"].size
            if n == 0:  # no rows, so no run of rows to name
                continue
            self.samples += n
            buffer = self._kinds.setdefault(kind, _KindBuffer())
            for name, column in frame.items():
                buffer.columns.setdefault(name, []).append(column)
            buffer.identity_index.append(np.full(n, index, dtype=np.int32))
            buffer.seq.append(np.arange(n, dtype=np.uint32))
            buffer.message_ids.append(batch.event_id)

    def message_ids(self) -> dict[str, list[str]]:
        """``{table: [message id of each run of rows, in row order]}``; a run starts where
        ``seq`` is 0."""
        return {raw_table_name(kind): list(buffer.message_ids)
                for kind, buffer in self._kinds.items()}

    def tables(self) -> dict[str, pa.Table]:
        out = {}
        for kind, buffer in self._kinds.items():
            arrays: dict[str, pa.Array] = {}
            times = np.concatenate(buffer.columns["event_time_ms"])
            arrays["event_time"] = pa.array(times, type=pa.timestamp("ms", tz="UTC"))
            per_message = np.concatenate(buffer.identity_index)
            for position, name in enumerate(IDENTITY_COLUMNS):
                arrays[name] = _dictionary([ident[position] for ident in self._identities],
                                           per_message)
            arrays["seq"] = pa.array(np.concatenate(buffer.seq))
            if kind != "gpu":
                arrays["gpu_uuid"] = _dictionary(self._batch_gpus, per_message)
            for name, dtype in FIELD_DTYPES[kind].items():
                if name == "event_time_ms":
                    continue
                column = np.concatenate(buffer.columns[name])
                if dtype is object:
                    arrays[name] = pa.array(column, type=pa.string())
                elif dtype is np.float64:
                    arrays[name] = pa.array(column, from_pandas=True)  # NaN → NULL
                else:
                    arrays[name] = pa.array(column)
            out[raw_table_name(kind)] = pa.table(arrays)
        return out

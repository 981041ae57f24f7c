"""Metric batches → one Arrow table per sample kind, one row per probe message.

A row holds a message's identity once and each field's samples of that kind as an array, in
the message's order: an insert costs about the samples' bytes, and the per-sample rows are
the views of ``raw_schema``. A row does not carry the message's id: at a few samples per
message, a random id would cost more bytes on disk than the samples. A missing float is
NaN in its array (NULL in the view), a label never set is ''.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsec.schemas import MetricBatch
from dsec.schemas.frames import FIELD_DTYPES, Frame

IDENTITY_COLUMNS = ("job_id", "node_id", "worker_id")


def raw_table_name(kind: str) -> str:
    """The per-sample view of a sample kind: what queries read."""
    return f"raw_{kind}"


def raw_message_table_name(kind: str) -> str:
    """The table a sample kind is stored in: a row per message."""
    return f"raw_{kind}_messages"


def sample_view_name(message_table: str) -> str:
    """The per-sample view of a message table."""
    return message_table.removesuffix("_messages")


def array_column_name(field: str) -> str:
    """A sample field's array column in its message table."""
    return {"event_time_ms": "times_ms", "gpu_uuid": "gpu_uuids"}.get(field, field)


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


def _values(column: np.ndarray, dtype: object) -> pa.Array:
    if dtype is object:
        return pc.fill_null(pa.array(column, type=pa.string()), "")
    return pa.array(column)


class RawColumnsBuilder:
    """Collects the frames of many batches; ``tables()`` gives one Arrow table per kind."""

    def __init__(self) -> None:
        self._kinds: dict[str, list[tuple[MetricBatch, Frame]]] = {}
        self.samples = 0

    def add(self, batch: MetricBatch, frames: dict[str, Frame]) -> None:
        """Adds one batch's frames; ``ValueError``, and nothing added, where a frame is not
        one flat column per field of its kind with one value per sample."""
        for kind, frame in frames.items():
            frame_problem(kind, frame)
        for kind, frame in frames.items():
            n = frame["event_time_ms"].size
            if n:  # a message without samples of a kind has no row of it
                self.samples += n
                self._kinds.setdefault(kind, []).append((batch, frame))

    def message_ids(self) -> dict[str, list[str]]:
        """``{table: [message id of each row, in row order]}``."""
        return {raw_message_table_name(kind): [batch.event_id for batch, _ in rows]
                for kind, rows in self._kinds.items()}

    def tables(self) -> dict[str, pa.Table]:
        out = {}
        for kind, rows in self._kinds.items():
            fields = FIELD_DTYPES[kind]
            headers = [batch for batch, _ in rows]
            sizes = np.fromiter((frame["event_time_ms"].size for _, frame in rows), np.int64,
                                len(rows))
            offsets = pa.array(np.concatenate(([0], np.cumsum(sizes))).astype(np.int32))
            firsts = np.fromiter((frame["event_time_ms"].min() for _, frame in rows), np.int64,
                                 len(rows))
            arrays: dict[str, pa.Array] = {
                "event_time": pa.array(firsts, type=pa.timestamp("ms", tz="UTC")),
                "job_id": pa.array([h.identity.job_id for h in headers]),
                "node_id": pa.array([h.identity.node_id for h in headers]),
                "worker_id": pa.array([h.identity.worker_id for h in headers]),
            }
            if "gpu_uuid" not in fields:
                arrays["gpu_uuid"] = pa.array([h.gpu_uuid or "" for h in headers])
            for name, dtype in fields.items():
                column = np.concatenate([frame[name] for _, frame in rows])
                arrays[array_column_name(name)] = pa.ListArray.from_arrays(
                    offsets, _values(column, dtype))
            out[raw_message_table_name(kind)] = pa.table(arrays)
        return out

"""A metric batch as columns: one numpy array per field and sample kind.

Rows and columns on the wire end up in the same shape here, with defaults filled in,
so that every computation downstream is column-wise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dsec.schemas import MetricBatch
from dsec.schemas.metrics import SAMPLE_MODELS

Frame = dict[str, np.ndarray]

_DTYPES: dict[type, Any] = {int: np.int64, float: np.float64, bool: np.bool_}


def _field_dtypes(kind: str) -> dict[str, Any]:
    """Required numbers keep their type; optional numbers are float so None can be NaN;
    everything else (strings, literals) is an object column."""
    out = {}
    for name, info in SAMPLE_MODELS[kind].model_fields.items():
        if name in ("kind", "event_id"):
            continue
        if info.annotation in _DTYPES:
            out[name] = _DTYPES[info.annotation]
        elif any(
            arg in _DTYPES or getattr(arg, "__origin__", None) in _DTYPES
            for arg in getattr(info.annotation, "__args__", ())
        ):
            out[name] = np.float64
        else:
            out[name] = object
    return out


FIELD_DTYPES: dict[str, dict[str, Any]] = {kind: _field_dtypes(kind) for kind in SAMPLE_MODELS}


def _column(values: list, dtype: Any) -> np.ndarray:
    if dtype is object:
        return np.asarray(values, dtype=object)
    if dtype is np.float64:
        return np.array(values, dtype=np.float64)  # None becomes NaN
    return np.asarray(values, dtype=dtype)


def batch_frames(batch: MetricBatch) -> dict[str, Frame]:
    """``{kind: {field: array}}`` with every field of the kind present and equal lengths."""
    lists: dict[str, dict[str, list]] = {}
    if batch.columns is not None:
        for kind, columns in batch.columns.kinds().items():
            n = len(columns)
            model = SAMPLE_MODELS[kind]
            target = lists.setdefault(kind, {name: [] for name in FIELD_DTYPES[kind]})
            for name in FIELD_DTYPES[kind]:
                values = getattr(columns, name)
                if values is None:
                    values = [model.model_fields[name].default] * n
                target[name].extend(values)
    for sample in batch.samples:
        target = lists.setdefault(sample.kind, {name: [] for name in FIELD_DTYPES[sample.kind]})
        for name in FIELD_DTYPES[sample.kind]:
            target[name].append(getattr(sample, name))
    return {
        kind: {name: _column(values, FIELD_DTYPES[kind][name]) for name, values in fields.items()}
        for kind, fields in lists.items()
    }

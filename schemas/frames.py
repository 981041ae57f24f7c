"""A metric batch as columns: one numpy array per field and sample kind.

Rows and columns on the wire end up in the same shape here, with defaults filled in,
so that every computation downstream is column-wise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dsec.schemas import MetricBatch
from dsec.schemas.metrics import FIELD_KINDS, SAMPLE_MODELS

Frame = dict[str, np.ndarray]

_DTYPES: dict[str, Any] = {"int": np.int64, "float": np.float64, "bool": np.bool_, "str": object}

FIELD_DTYPES: dict[str, dict[str, Any]] = {
    kind: {name: _DTYPES[value_kind] for name, value_kind in fields.items()}
    for kind, fields in FIELD_KINDS.items()
}


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

"""Column-wise validation of metric batches, at the speed the stream jobs need.

``MetricBatch`` (pydantic) is the reference contract. Validating its columnar form
element by element costs more than everything else the stream jobs do, so columns are
checked here a column at a time with numpy instead: types, bounds, lengths, unknown
fields and kinds, with the same rules as the models, and the same kind of reason
("columns.step.grad_norm: ...") for the dead letter. Batches sent as rows go through
pydantic as they are.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from typing import Any

import annotated_types
import numpy as np
import orjson

from dsec.schemas import DecodeError, MetricBatch, decode
from dsec.schemas.codec import base64_bytes
from dsec.schemas.event_times import EventTimeWindow, check_event_times
from dsec.schemas.frames import FIELD_DTYPES, Frame, batch_frames
from dsec.schemas.metrics import MAX_SAMPLES_PER_BATCH, SAMPLE_MODELS


@dataclass(frozen=True)
class _FieldRule:
    dtype: Any
    required: bool
    nullable: bool
    default: Any
    lower: tuple[float, bool] | None  # (bound, inclusive)
    upper: tuple[float, bool] | None
    choices: frozenset[str] | None
    max_length: int | None
    pattern: re.Pattern[str] | None = None
    min_length: int = 0


def _pattern(pattern: str) -> re.Pattern[str]:
    """``pattern`` as pydantic matches it: its "$" is the end of the text, where Python's
    "$" also matches before a final newline ("GPU-1\n" would pass)."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _rule(info: Any, dtype: Any) -> _FieldRule:
    lower = upper = None
    max_length = None
    min_length = 0
    pattern = None
    annotation = info.annotation
    metadata = list(info.metadata)
    args = typing.get_args(annotation)
    nullable = type(None) in args
    for arg in args:
        metadata.extend(getattr(arg, "__metadata__", ()))
    # A FieldInfo inside Annotated carries its own constraints: flatten them in.
    metadata += [sub for item in metadata for sub in getattr(item, "metadata", ())]
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            lower = (float(item.ge), True)
        elif isinstance(item, annotated_types.Gt):
            lower = (float(item.gt), False)
        elif isinstance(item, annotated_types.Le):
            upper = (float(item.le), True)
        elif isinstance(item, annotated_types.Lt):
            upper = (float(item.lt), False)
        elif isinstance(item, annotated_types.MaxLen):
            max_length = item.max_length
        elif isinstance(item, annotated_types.MinLen):
            min_length = item.min_length
        if getattr(item, "pattern", None):
            pattern = _pattern(item.pattern)
    choices = None
    literal_args = [a for a in (annotation, *args) if typing.get_origin(a) is typing.Literal]
    if literal_args:
        choices = frozenset(str(v) for v in typing.get_args(literal_args[0]))
    return _FieldRule(dtype=dtype, required=info.is_required(), nullable=nullable,
                      default=info.default, lower=lower, upper=upper, choices=choices,
                      max_length=max_length, pattern=pattern, min_length=min_length)


RULES: dict[str, dict[str, _FieldRule]] = {
    kind: {name: _rule(SAMPLE_MODELS[kind].model_fields[name], dtype)
           for name, dtype in fields.items()}
    for kind, fields in FIELD_DTYPES.items()
}


def _fail(kind: str, name: str, message: str) -> DecodeError:
    return DecodeError(f"invalid MetricBatch: columns.{kind}.{name}: {message}")


def _numbers(kind: str, name: str, values: list, rule: _FieldRule) -> np.ndarray:
    """JSON numbers (and booleans where pydantic also takes them) into a typed column."""
    if len(values) <= _SMALL_COLUMN:
        array = _small_numbers(kind, name, values, rule)
        if array is not None:
            return array
    try:
        array = np.asarray(values)
    except (ValueError, OverflowError):
        raise _fail(kind, name, "expected a list of numbers") from None
    if array.ndim != 1:  # a list of equal-length lists, which the model refuses too
        raise _fail(kind, name, f"expected a list of {_NOUN[rule.dtype]}, not of lists")
    if array.dtype == object:  # nulls, or mixed types: only optional floats may hold them
        if rule.dtype is not np.float64 or any(isinstance(v, str) for v in values):
            raise _fail(kind, name, f"expected a list of {_NOUN[rule.dtype]}")
        try:
            array = np.array(values, dtype=np.float64)  # None → NaN
        except (ValueError, TypeError):
            raise _fail(kind, name, "expected a list of numbers") from None
        if not rule.nullable and np.isnan(array).any():
            raise _fail(kind, name, "null where a number is required")
    elif array.dtype.kind not in "biuf" or (array.size == 0 and rule.dtype is not np.float64):
        if array.size:
            raise _fail(kind, name, f"expected a list of {_NOUN[rule.dtype]}")
        array = np.zeros(0, dtype=rule.dtype)
    if rule.dtype is np.bool_:
        if array.dtype.kind != "b" and not np.isin(array, (0, 1)).all():
            raise _fail(kind, name, "expected a list of booleans")
        return array.astype(np.bool_, copy=False)
    if rule.dtype is np.int64:
        if array.dtype.kind == "f" and not (np.isfinite(array) & (array == np.floor(array))).all():
            raise _fail(kind, name, "expected integers, got a number with a fractional part")
        if array.dtype.kind == "f" and ((array >= 2.0**63) | (array < -(2.0**63))).any():
            raise _fail(kind, name, "integer out of range")
        if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
            raise _fail(kind, name, "integer out of range")
        array = array.astype(np.int64, copy=False)
    else:
        array = array.astype(np.float64, copy=False)
    return _checked(kind, name, array, rule)


def _checked(kind: str, name: str, array: np.ndarray, rule: _FieldRule) -> np.ndarray:
    """The column's bounds, as the model's field states them, from its least and greatest
    value. NaN (null) compares false with every bound and ``fmin``/``fmax`` pass over it,
    so nulls pass without being filtered out first."""
    if not array.size or (rule.lower is None and rule.upper is None):
        return array
    if array.size <= _SMALL_COLUMN:
        return _checked_small(kind, name, array, rule)
    _check_bounds(kind, name,
                  np.fmin.reduce(array) if rule.lower is not None else None,
                  np.fmax.reduce(array) if rule.upper is not None else None, rule)
    return array


def _check_bounds(kind: str, name: str, least: Any, greatest: Any, rule: _FieldRule) -> None:
    """The field's bounds against a column's least and greatest value (each needed only
    where the field has that bound). NaN compares false with every bound, so it passes."""
    if rule.lower is not None:
        bound, inclusive = rule.lower
        if least < bound if inclusive else least <= bound:
            raise _fail(kind, name, f"values must be {'>=' if inclusive else '>'} {bound:g}")
    if rule.upper is not None:
        bound, inclusive = rule.upper
        if greatest > bound if inclusive else greatest >= bound:
            raise _fail(kind, name, f"values must be {'<=' if inclusive else '<'} {bound:g}")


# Up to this many values a column's bounds are checked on its Python numbers: a probe's
# message at training rates holds a few samples a kind, where numpy's per-call cost is most
# of the work.
_SMALL_COLUMN = 32


def _small_numbers(kind: str, name: str, values: list, rule: _FieldRule) -> np.ndarray | None:
    """A short column whose values are all of the column's own Python type (``float`` for
    a float column, ``int`` within 64 bits for an integer one), checked on those numbers
    before one array is made; None for any other column, which ``_numbers`` then takes
    the general way. A probe's message at training rates holds a few samples a kind."""
    if not values:
        return None
    if rule.dtype is np.float64:
        if not all(type(value) is float for value in values):
            return None
        _bounds_small(kind, name, [value for value in values if value == value], rule)
        return np.array(values, dtype=np.float64)
    if rule.dtype is np.int64:
        if not all(type(value) is int for value in values):
            return None
        least, greatest = min(values), max(values)
        if least < -(1 << 63) or greatest >= 1 << 63:
            return None
        _bounds_small(kind, name, [least, greatest], rule)
        return np.array(values, dtype=np.int64)
    return None


def _checked_small(kind: str, name: str, array: np.ndarray, rule: _FieldRule) -> np.ndarray:
    """``_checked`` on a short column: the same verdicts, NaN passed over as there."""
    _bounds_small(kind, name, [value for value in array.tolist() if value == value], rule)
    return array


def _bounds_small(kind: str, name: str, values: list, rule: _FieldRule) -> None:
    """The column's bounds on its Python numbers (NaN left out by the caller)."""
    if values:
        _check_bounds(kind, name, min(values) if rule.lower is not None else None,
                      max(values) if rule.upper is not None else None, rule)


_NOUN = {np.bool_: "booleans", np.int64: "integers", np.float64: "numbers"}
_PACKED_FOR = {np.float64: ("<f8", "<f4"), np.int64: ("<i8",), np.bool_: ("|b1",)}


def _packed(kind: str, name: str, value: dict, rule: _FieldRule, n: int) -> np.ndarray:
    """A packed column (little-endian bytes in base64) straight into a typed array."""
    dtype, data = value.get("dtype"), value.get("data")
    if rule.dtype is object or set(value) != {"dtype", "data"} or not isinstance(data, str):
        raise _fail(kind, name, "expected a list, or {dtype, data} for a numeric column")
    if dtype not in _PACKED_FOR[rule.dtype]:
        raise _fail(kind, name, f"packed dtype must be one of {list(_PACKED_FOR[rule.dtype])}")
    try:
        raw = base64_bytes(data)
    except ValueError:  # binascii.Error, or a str with characters outside ASCII
        raise _fail(kind, name, "packed data is not base64") from None
    if len(raw) != n * np.dtype(dtype).itemsize:
        raise _fail(kind, name, f"columns of one kind must have equal lengths ({n})")
    # A read-only view of the bytes where the dtype is already the column's: no copy.
    array = np.frombuffer(raw, dtype=dtype).astype(rule.dtype, copy=False)
    if rule.dtype is np.float64 and not (rule.nullable or np.isfinite(array).all()):
        if np.isnan(array).any():
            raise _fail(kind, name, "null where a number is required")
        raise _fail(kind, name, "values must be finite")
    if rule.dtype is np.float64 and rule.nullable and np.isinf(array).any():
        # JSON has no infinity, so a list never carries one; packed bytes must not either.
        raise _fail(kind, name, "values must be finite")
    return _checked(kind, name, array, rule)


def _strings(kind: str, name: str, values: list, rule: _FieldRule) -> np.ndarray:
    for value in values:
        if value is None:
            if not rule.nullable:
                raise _fail(kind, name, "null where a string is required")
            continue
        if not isinstance(value, str):
            raise _fail(kind, name, "expected a list of strings")
        if rule.max_length is not None and len(value) > rule.max_length:
            raise _fail(kind, name, f"strings must be at most {rule.max_length} characters")
        if len(value) < rule.min_length:
            raise _fail(kind, name, f"strings must be at least {rule.min_length} characters")
        if rule.pattern is not None and not rule.pattern.search(value):
            raise _fail(kind, name, f"strings must match {rule.pattern.pattern}")
        if rule.choices is not None and value not in rule.choices:
            raise _fail(kind, name, f"expected one of {sorted(rule.choices)}")
    return np.asarray(values, dtype=object)


_DEFAULT_COLUMNS: dict[tuple[str, str, int], np.ndarray] = {}


def _default_column(kind: str, name: str, rule: _FieldRule, n: int) -> np.ndarray:
    """A column the message left out: ``n`` copies of the model's default, valid by
    definition. Read-only, as packed columns are; the short ones are made once and shared."""
    key = (kind, name, n)
    column = _DEFAULT_COLUMNS.get(key)
    if column is None:
        default = np.nan if rule.default is None and rule.dtype is np.float64 else rule.default
        column = np.full(n, default, dtype=rule.dtype)
        column.flags.writeable = False
        if n <= _SMALL_COLUMN:
            _DEFAULT_COLUMNS[key] = column
    return column


def _frame(kind: str, columns: Any) -> Frame:
    rules = RULES.get(kind)
    if rules is None:
        raise DecodeError(f"invalid MetricBatch: columns.{kind}: unknown sample kind")
    if not isinstance(columns, dict):
        raise DecodeError(f"invalid MetricBatch: columns.{kind}: expected an object")
    unknown = set(columns) - set(rules)
    if unknown:
        raise _fail(kind, sorted(unknown)[0], "extra inputs are not permitted")
    times = columns.get("event_time_ms")
    if isinstance(times, dict) and isinstance(times.get("data"), str):
        data = times["data"]  # decoded and checked below; here only its length is needed
        n = (len(data) * 3 // 4 - data[-2:].count("=")) // 8
    elif isinstance(times, list):
        n = len(times)
    else:
        raise _fail(kind, "event_time_ms", "field required (a list)")
    if n > MAX_SAMPLES_PER_BATCH:
        raise _fail(kind, "event_time_ms", f"at most {MAX_SAMPLES_PER_BATCH} samples")
    frame: Frame = {}
    for name, rule in rules.items():
        values = columns.get(name)
        if values is None:
            if rule.required:
                raise _fail(kind, name, "field required")
            frame[name] = _default_column(kind, name, rule, n)
            continue
        if isinstance(values, dict):
            frame[name] = _packed(kind, name, values, rule, n)
            continue
        elif not isinstance(values, list):
            raise _fail(kind, name, "expected a list")
        elif len(values) != n:
            raise _fail(kind, name, f"columns of one kind must have equal lengths ({n})")
        if rule.dtype is object:
            frame[name] = _strings(kind, name, values, rule)
        else:
            frame[name] = _numbers(kind, name, values, rule)
    return frame


def _with_samples(frames: dict[str, Frame]) -> dict[str, Frame]:
    """The frames that hold samples: a kind sent with none (``"recovery": {"event_time_ms":
    []}``) is no frame at all, whichever form it came in."""
    return {kind: frame for kind, frame in frames.items() if frame["event_time_ms"].size}


@dataclass(frozen=True)
class DecodedBatch:
    header: MetricBatch  # identity and ids; its samples and columns are left empty
    frames: dict[str, Frame]

    def sample_count(self) -> int:
        return sum(frame["event_time_ms"].size for frame in self.frames.values())


def decode_metric_batch(
    data: bytes | None, event_times: EventTimeWindow | None = None, now_ms: int | None = None
) -> DecodedBatch:
    """Validates a metric batch and returns it as frames; raises ``DecodeError``.

    ``event_times``: the sample times the store keeps (checked against ``now_ms``, the
    clock by default); without it, times are checked only against the model's bounds."""
    if data is None:
        raise DecodeError("empty message (tombstone) where an event was expected")
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid MetricBatch: not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise DecodeError("invalid MetricBatch: expected a JSON object")
    columns = document.pop("columns", None)
    if document.get("samples"):
        batch = decode(data, MetricBatch)
        frames = _with_samples(batch_frames(batch))
        if event_times is not None:
            check_event_times(frames, event_times, now_ms, "samples")
        return DecodedBatch(batch.model_copy(update={"samples": [], "columns": None}), frames)
    header = decode(orjson.dumps(document), MetricBatch)
    if columns is None:
        return DecodedBatch(header, {})
    if not isinstance(columns, dict):
        raise DecodeError("invalid MetricBatch: columns: expected an object")
    frames = {kind: _frame(kind, cols) for kind, cols in columns.items() if cols is not None}
    if event_times is not None:
        check_event_times(frames, event_times, now_ms, "columns")
    return DecodedBatch(header, _with_samples(frames))

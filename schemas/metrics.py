"""Metric events published by the probes inside training workers.

One Kafka message per worker per flush interval: a ``MetricBatch`` carries the
producer's identity once and many samples, so that the message rate stays low
while the sample rate is high. Samples travel either as rows (``samples``, handy for
hand-written producers) or as columns (``columns``: one entry per field and kind, a JSON
list or a ``PackedColumn`` of little-endian bytes, which is what the probe sends):
columns are a fraction of the bytes of rows and validate a column at a time, which is
what lets one stream-job process take a million samples a second.
"""

from __future__ import annotations

import base64
import binascii
import typing
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BeforeValidator, ConfigDict, Field, create_model, model_validator

from dsec.schemas.base import (
    Count,
    EpochMs,
    Event,
    Identifier,
    Model,
    WorkerIdentity,
    new_event_id,
)


def _not_a_string(value: Any) -> Any:
    # Lax validation would read "5" as 5: a number travels as a JSON number, and the
    # column decoder refuses the string too.
    if isinstance(value, str):
        raise ValueError("expected a JSON number (or true/false), not a string")
    return value


_JSON = BeforeValidator(_not_a_string)  # on every number and flag of a sample
Number = Annotated[float, _JSON]
NonNegative = Annotated[float, Field(ge=0), _JSON]
Flag = Annotated[bool, _JSON]
FiniteOrNone = Number | None  # non-finite values travel as None with a flag beside them
NonNegativeInt = Annotated[Count, _JSON]  # the raw tables keep integers as Int64


class _Sample(Model):
    # JSON has no infinity or NaN: a row refuses them as the column decoder does.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    event_id: Annotated[str, Field(min_length=8, max_length=64)] = Field(
        default_factory=new_event_id
    )
    event_time_ms: Annotated[EpochMs, _JSON]


class HeartbeatSample(_Sample):
    kind: Literal["heartbeat"] = "heartbeat"
    interval_s: Annotated[float, Field(gt=0, le=3600), _JSON]
    step: NonNegativeInt = 0
    samples_sent: NonNegativeInt = 0
    samples_buffered: NonNegativeInt = 0
    samples_dropped: NonNegativeInt = 0
    # Since the probe started; recorded == sent + buffered + dropped at any moment.
    samples_recorded: NonNegativeInt = 0
    messages_failed: NonNegativeInt = 0


MICRO_STEP = "micro_step"  # grad_norm_source of a micro-step's sample


class StepSample(_Sample):
    kind: Literal["step"] = "step"
    step: NonNegativeInt
    loss: FiniteOrNone = None
    grad_norm: NonNegative | None = None
    loss_nonfinite: Flag = False
    grad_nonfinite: Flag = False
    step_time_ms: NonNegative | None = None
    # "probe": computed by the probe; "trainer": the norm the trainer already had (clipping);
    # "micro_step": one backward's gradients while the loop accumulates (the sample stands
    # for a micro-step of ``step``, not for a step of its own).
    grad_norm_source: Literal["probe", "trainer", "micro_step"] | None = None


class EpisodeSample(_Sample):
    kind: Literal["episode"] = "episode"
    episode_index: NonNegativeInt
    reward: Number
    length: NonNegativeInt
    terminated: Flag = True
    truncated: Flag = False
    termination_reason: Annotated[str, Field(max_length=256)] | None = None


class GpuSample(_Sample):
    kind: Literal["gpu"] = "gpu"
    gpu_uuid: Identifier
    gpu_model: Annotated[str, Field(max_length=128)] = ""
    memory_used_bytes: NonNegativeInt
    memory_total_bytes: NonNegativeInt
    utilisation_pct: Annotated[float, Field(ge=0, le=100), _JSON] | None = None
    temperature_c: Number | None = None
    sm_clock_mhz: NonNegative | None = None
    throttle_reasons: NonNegativeInt = 0
    power_w: NonNegative | None = None
    # What the reporting process itself holds on this GPU (NVML's per-process figure),
    # beside the card-wide ``memory_used_bytes``; None where it cannot be read.
    process_memory_used_bytes: NonNegativeInt | None = None


class GradSyncSample(_Sample):
    kind: Literal["grad_sync"] = "grad_sync"
    step: NonNegativeInt
    bytes: NonNegativeInt
    latency_ms: NonNegative
    ok: Flag = True
    op: Annotated[str, Field(max_length=64)] = "all_reduce"
    timer: Literal["wall_clock", "cuda_event"] = "wall_clock"
    error: Annotated[str, Field(max_length=256)] | None = None


class CudaMemorySample(_Sample):
    """``torch.cuda.memory_stats`` of the device the training thread uses."""

    kind: Literal["cuda_memory"] = "cuda_memory"
    device_index: NonNegativeInt
    allocated_bytes: NonNegativeInt
    reserved_bytes: NonNegativeInt
    active_bytes: NonNegativeInt = 0
    peak_allocated_bytes: NonNegativeInt = 0
    # Reserved but not allocated, as a share of reserved: 0 when nothing is reserved.
    fragmentation_ratio: Annotated[float, Field(ge=0, le=1), _JSON] = 0.0
    oom_count: NonNegativeInt = 0
    alloc_retry_count: NonNegativeInt = 0


class RuntimeSample(_Sample):
    """A non-Python runtime (an agent platform) as it registered with the ingest gateway."""

    kind: Literal["runtime"] = "runtime"
    runtime_type: Annotated[str, Field(min_length=1, max_length=64)]
    concurrency: Annotated[int, Field(ge=1, le=1_000_000), _JSON]
    mean_call_latency_ms: NonNegative
    function_calling: Flag


class RecoverySample(_Sample):
    """The worker resumed after an interruption: how, and how long it took."""

    kind: Literal["recovery"] = "recovery"
    step: NonNegativeInt = 0
    recovery_time_s: Annotated[float, Field(ge=0, le=86400), _JSON]
    source: Literal["snapshot", "checkpoint", "scratch"] = "snapshot"


MetricSample = Annotated[
    HeartbeatSample
    | StepSample
    | EpisodeSample
    | GpuSample
    | GradSyncSample
    | CudaMemorySample
    | RuntimeSample
    | RecoverySample,
    Field(discriminator="kind"),
]

SAMPLE_MODELS: dict[str, type[_Sample]] = {
    model.model_fields["kind"].default: model
    for model in (HeartbeatSample, StepSample, EpisodeSample, GpuSample, GradSyncSample,
                  CudaMemorySample, RuntimeSample, RecoverySample)
}
MAX_SAMPLES_PER_BATCH = 100_000


def _value_kind(info: Any) -> str:
    """How a field travels in columns: required numbers keep their type, optional numbers are
    floats (null is NaN), everything else is a string."""
    if info.annotation in (int, float, bool):
        return info.annotation.__name__
    for arg in typing.get_args(info.annotation):
        if arg in (int, float) or getattr(arg, "__origin__", None) in (int, float):
            return "float"
    return "str"


FIELD_KINDS: dict[str, dict[str, str]] = {
    kind: {name: _value_kind(info) for name, info in model.model_fields.items()
           if name not in ("kind", "event_id")}
    for kind, model in SAMPLE_MODELS.items()
}
PACKED_DTYPES = {"float": "<f8", "int": "<i8", "bool": "|b1"}
_PACKED_ITEMSIZE = {"<f8": 8, "<f4": 4, "<i8": 8, "|b1": 1}


class PackedColumn(Model):
    """A column of numbers as little-endian bytes in base64: a tenth of the parsing cost of
    a JSON list. Floats may be ``<f8`` or ``<f4`` (NaN is null), integers ``<i8``, booleans
    ``|b1``."""

    dtype: Literal["<f8", "<f4", "<i8", "|b1"]
    data: Annotated[str, Field(max_length=4 * MAX_SAMPLES_PER_BATCH * 8 // 3 + 4)]


_PACKED_FOR = {"float": ("<f8", "<f4"), "int": ("<i8",), "bool": ("|b1",), "str": ()}


def unpack_column(value: dict[str, Any], value_kind: str) -> list:
    """A packed column as a list (NaN → None); ``ValueError`` when it is not one, or not
    one for a column of ``value_kind``."""
    packed = PackedColumn.model_validate(value)
    if packed.dtype not in _PACKED_FOR[value_kind]:
        raise ValueError(f"packed dtype {packed.dtype} does not fit a {value_kind} column")
    try:
        raw = base64.b64decode(packed.data, validate=True)
    except binascii.Error:
        raise ValueError("packed column data is not base64") from None
    if len(raw) % _PACKED_ITEMSIZE[packed.dtype]:
        raise ValueError(f"packed column length is not a multiple of {packed.dtype}")
    array = np.frombuffer(raw, dtype=packed.dtype)
    if array.dtype.kind == "f":
        return [None if value != value else value for value in array.tolist()]
    return array.tolist()


def pack_columns(columns: dict[str, dict[str, list]]) -> dict[str, dict[str, Any]]:
    """The ``columns`` form with every numeric column packed (strings stay lists)."""
    out: dict[str, dict[str, Any]] = {}
    for kind, fields in columns.items():
        out[kind] = {}
        for name, values in fields.items():
            value_kind = FIELD_KINDS[kind][name]
            if value_kind == "str":
                out[kind][name] = values
                continue
            dtype = PACKED_DTYPES[value_kind]
            array = (np.array(values, dtype=np.float64) if value_kind == "float"
                     else np.asarray(values, dtype=dtype))
            out[kind][name] = {"dtype": dtype,
                               "data": base64.b64encode(array.astype(dtype).tobytes()).decode()}
    return out


class _Columns(Model):
    """Equal-length lists, one per field of the row model; optional fields may be left out.
    Any numeric column may instead be a ``PackedColumn`` object (its JSON Schema is
    exported beside this one); it is a list once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    sample_kind: typing.ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _unpack(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        kinds = FIELD_KINDS[cls.sample_kind]
        return {
            name: unpack_column(value, kinds.get(name, "str")) if isinstance(value, dict)
            else value
            for name, value in data.items()
        }

    @model_validator(mode="after")
    def _equal_lengths(self) -> _Columns:
        lengths = {len(v) for v in self.__dict__.values() if v is not None}
        if len(lengths) > 1:
            raise ValueError(f"columns of one kind must have equal lengths, got {sorted(lengths)}")
        return self

    def __len__(self) -> int:
        return len(self.event_time_ms)  # type: ignore[attr-defined]


def _columns_model(row_model: type[_Sample]) -> type[_Columns]:
    fields: dict[str, Any] = {}
    for name, info in row_model.model_fields.items():
        if name in ("kind", "event_id"):
            continue
        column = Annotated[list[info.rebuild_annotation()],  # type: ignore[misc]
                           Field(max_length=MAX_SAMPLES_PER_BATCH)]
        fields[name] = (column, ...) if info.is_required() else (column | None, None)
    model = create_model(f"{row_model.__name__}Columns", __base__=_Columns, **fields)
    model.sample_kind = row_model.model_fields["kind"].default
    return model


HeartbeatColumns = _columns_model(HeartbeatSample)
StepColumns = _columns_model(StepSample)
EpisodeColumns = _columns_model(EpisodeSample)
GpuColumns = _columns_model(GpuSample)
GradSyncColumns = _columns_model(GradSyncSample)
CudaMemoryColumns = _columns_model(CudaMemorySample)
RuntimeColumns = _columns_model(RuntimeSample)
RecoveryColumns = _columns_model(RecoverySample)


class MetricColumns(Model):
    heartbeat: HeartbeatColumns | None = None  # type: ignore[valid-type]
    step: StepColumns | None = None  # type: ignore[valid-type]
    episode: EpisodeColumns | None = None  # type: ignore[valid-type]
    gpu: GpuColumns | None = None  # type: ignore[valid-type]
    grad_sync: GradSyncColumns | None = None  # type: ignore[valid-type]
    cuda_memory: CudaMemoryColumns | None = None  # type: ignore[valid-type]
    runtime: RuntimeColumns | None = None  # type: ignore[valid-type]
    recovery: RecoveryColumns | None = None  # type: ignore[valid-type]

    def kinds(self) -> dict[str, _Columns]:
        return {kind: cols for kind, cols in self.__dict__.items() if cols is not None}

    def __len__(self) -> int:
        return sum(len(cols) for cols in self.kinds().values())


class MetricBatch(Event):
    """One probe flush: the worker's identity once, its samples since the last flush."""

    identity: WorkerIdentity
    gpu_uuid: Identifier | None = None
    samples: Annotated[list[MetricSample], Field(max_length=MAX_SAMPLES_PER_BATCH)] = []
    columns: MetricColumns | None = None

    def sample_count(self) -> int:
        return len(self.samples) + (len(self.columns) if self.columns is not None else 0)

    def rows(self) -> list[_Sample]:
        """Every sample as a row model, whichever form it travelled in (columns first).
        Convenient, not fast: the stream jobs read columns as columns."""
        out: list[_Sample] = []
        if self.columns is not None:
            for kind, columns in self.columns.kinds().items():
                model = SAMPLE_MODELS[kind]
                given = {name: values for name, values in columns.__dict__.items()
                         if values is not None}
                for index in range(len(columns)):
                    out.append(model(event_id=f"{self.event_id}-{kind}-{index}",
                                     **{name: values[index] for name, values in given.items()}))
        return out + list(self.samples)


def duplicate_key(batch: MetricBatch) -> str:
    """What makes two metric messages one batch, whatever their offsets: the sink stores
    it once and the stream jobs count it once."""
    return batch.event_id


def encode_packed(batch: MetricBatch) -> bytes:
    """The batch's wire form with its numeric columns packed (what the probe sends)."""
    import orjson

    document = batch.model_dump(mode="json", exclude_none=True)
    if document.get("columns"):
        document["columns"] = pack_columns(document["columns"])
    return orjson.dumps(document)


def columns_from_rows(rows: list[dict[str, Any]]) -> dict[str, dict[str, list]]:
    """Sample dicts (with ``kind``) pivoted into the ``columns`` form: one list per field
    and kind. A field no sample of a kind has is left out; where only some have it, the
    others get the field's default."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], []).append(row)
    out: dict[str, dict[str, list]] = {}
    for kind, kind_rows in by_kind.items():
        fields = SAMPLE_MODELS[kind].model_fields
        present = {name for row in kind_rows for name in row} - {"kind", "event_id"}
        out[kind] = {
            name: [row.get(name, fields[name].default) for row in kind_rows]
            for name in fields if name in present
        }
    return out

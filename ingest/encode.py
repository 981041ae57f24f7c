"""A probe's buffered samples as the ``columns`` of one ``MetricBatch``: pure functions.

The flusher wakes every flush interval (250 ms by default) to a cold cache, so every Python
operation it runs costs several times its warm price, and the training step pays for it
(CPU and the GIL). The two kinds a training loop records at step rate, steps and episodes,
go straight from the buffered tuples to columns (one ``zip`` per kind, numbers checked
inline rather than by a call each, C-level ``count`` for the optional fields, which is
several times cheaper on a cold flush than a helper per value); the rare kinds go through
one dict per sample. Short numeric columns travel as JSON lists: packing a handful of
values costs more than it saves. Long ones (a backlog after an outage, a fast loop sampled
every step) are packed, which is what the stream jobs read fastest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dsec.ingest.values import as_float, finite_or_flag
from dsec.schemas.metrics import columns_from_rows, pack_columns

# Numeric columns of at least this many values are packed; shorter ones stay lists.
PACK_MIN_VALUES = 64
MAX_TEXT_CHARS = 256


def _finite_column(values: Iterable[Any]) -> tuple[list[float | None], list[bool]]:
    """Numbers or tensors as (finite values, NaN/Inf flags), as ``finite_or_flag`` gives
    them. Tensors are read one by one: on the flusher's cold start a ``stack`` of a few
    costs more than their ``item`` calls."""
    numbers: list[float | None] = []
    flags: list[bool] = []
    for value in values:
        number = value if value is None or type(value) is float else as_float(value)
        if number is None or number - number == 0.0:  # NaN and Inf minus themselves: NaN
            numbers.append(number)
            flags.append(False)
        else:
            numbers.append(None)
            flags.append(True)
    return numbers, flags


def _put_if_any(columns: dict[str, list], name: str, values: list) -> None:
    """An optional field's column, left out when no sample has a value for it."""
    if values.count(None) != len(values):
        columns[name] = values


def step_columns(raws: list[tuple]) -> dict[str, list]:
    """``("step", event_time_ms, step, loss, grad_norm, step_time_ms, source)`` tuples."""
    _kinds, times, steps, losses, norms, step_times, sources = zip(*raws, strict=True)
    loss_values, loss_flags = _finite_column(losses)
    norm_values, norm_flags = _finite_column(norms)
    columns: dict[str, list] = {"event_time_ms": list(times), "step": list(steps)}
    _put_if_any(columns, "loss", loss_values)
    _put_if_any(columns, "grad_norm", norm_values)
    columns["loss_nonfinite"] = loss_flags
    columns["grad_nonfinite"] = norm_flags
    _put_if_any(columns, "step_time_ms", list(step_times))
    _put_if_any(columns, "grad_norm_source", list(sources))
    return columns


def episode_columns(raws: list[tuple]) -> dict[str, list]:
    """``("episode", event_time_ms, index, reward, length, terminated, truncated, reason)``."""
    _kinds, times, indices, rewards, lengths, terminated, truncated, reasons = zip(
        *raws, strict=True)
    columns: dict[str, list] = {
        "event_time_ms": list(times),
        "episode_index": list(indices),
        "reward": [float(reward) for reward in rewards],
        "length": [int(length) for length in lengths],
        "terminated": list(terminated),
        "truncated": list(truncated),
    }
    _put_if_any(columns, "termination_reason",
                [None if reason is None else str(reason)[:MAX_TEXT_CHARS] for reason in reasons])
    return columns


def sample_dict(raw: tuple) -> dict[str, Any]:
    """One buffered tuple as its wire fields (``kind`` included): the general path, and the
    reference the column builders above are tested against."""
    kind, event_time_ms = raw[0], raw[1]
    sample: dict[str, Any] = {"event_time_ms": event_time_ms, "kind": kind}
    if kind == "step":
        _, _, step, loss, grad_norm, step_time_ms, source = raw
        loss_value, loss_nonfinite = finite_or_flag(loss)
        norm_value, grad_nonfinite = finite_or_flag(grad_norm)
        sample.update(step=step, loss_nonfinite=loss_nonfinite, grad_nonfinite=grad_nonfinite)
        if loss_value is not None:
            sample["loss"] = loss_value
        if norm_value is not None:
            sample["grad_norm"] = norm_value
        if source is not None:
            sample["grad_norm_source"] = source
        if step_time_ms is not None:
            sample["step_time_ms"] = step_time_ms
    elif kind == "episode":
        _, _, index, reward, length, terminated, truncated, reason = raw
        sample.update(
            episode_index=index, reward=float(reward), length=int(length),
            terminated=terminated, truncated=truncated,
        )
        if reason is not None:
            sample["termination_reason"] = str(reason)[:MAX_TEXT_CHARS]
    elif kind == "heartbeat":
        _, _, interval_s, step, sent, buffered, dropped, recorded, failed = raw
        sample.update(
            interval_s=interval_s, step=step, samples_sent=sent,
            samples_buffered=buffered, samples_dropped=dropped,
            samples_recorded=recorded, messages_failed=failed,
        )
    elif kind == "grad_sync":
        _, _, step, nbytes, latency_ms, ok, op, timer, error = raw
        sample.update(step=step, bytes=int(nbytes), latency_ms=max(0.0, float(latency_ms)),
                      ok=ok, op=op[:64], timer=timer)
        if error:
            sample["error"] = error[:MAX_TEXT_CHARS]
    elif kind == "fields":
        sample["kind"] = raw[2]
        sample.update(raw[3])
    return sample


def batch_columns(batch: list[tuple]) -> dict[str, dict[str, list]]:
    """Buffered tuples as ``{kind: {field: values}}``, in buffer order within each kind."""
    steps: list[tuple] = []
    episodes: list[tuple] = []
    rare: list[dict[str, Any]] = []
    for raw in batch:
        kind = raw[0]
        if kind == "step":
            steps.append(raw)
        elif kind == "episode":
            episodes.append(raw)
        else:
            rare.append(sample_dict(raw))
    columns: dict[str, dict[str, list]] = {}
    if steps:
        columns["step"] = step_columns(steps)
    if episodes:
        columns["episode"] = episode_columns(episodes)
    if rare:
        columns.update(columns_from_rows(rare))
    return columns


def pack_long_columns(columns: dict[str, dict[str, list]],
                      min_values: int = PACK_MIN_VALUES) -> dict[str, dict[str, Any]]:
    """Packs the numeric columns of the kinds with at least ``min_values`` samples."""
    out: dict[str, dict[str, Any]] = {}
    for kind, fields in columns.items():
        length = len(next(iter(fields.values()), ()))
        out[kind] = pack_columns({kind: fields})[kind] if length >= min_values else fields
    return out


"""The reaction bench's figures from its timestamps: pure functions, no I/O.

A trial has the worker's two wall-clock times (the NaN step handed to the probe, the apply
hook run) and the Kafka timestamps of the three messages between them (the probe's flush,
the feature event, the command). Every clock is this host's, so differences are valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dsec.stream_jobs.stats import percentiles

NS_PER_MS = 1_000_000
STAGES = ("recorded_to_published", "published_to_features", "features_to_command",
          "command_to_applied")


@dataclass(frozen=True)
class TrialRecord:
    """One trial, as the worker saw it (wall-clock ns)."""

    trial: int
    worker_id: str
    warmup: bool
    recorded_ns: int  # the NaN step handed to the probe
    applied_ns: int | None  # the apply hook ran; None: not within the trial's timeout
    applied_dtype: str | None = None


@dataclass(frozen=True)
class StageTimes:
    """Kafka timestamps (producer wall-clock ms) of the messages a trial caused."""

    published_ms: int | None = None  # the probe's message holding the NaN step
    features_ms: int | None = None  # the first feature event counting it
    command_ms: int | None = None  # the policy's command to the worker


def summarise_ms(values_ms: Sequence[float]) -> dict[str, float | int | None]:
    """Count, min, p50, p99, max and mean; percentiles interpolate between closest ranks."""
    if not values_ms:
        return {"count": 0, "min_ms": None, "p50_ms": None, "p99_ms": None, "max_ms": None,
                "mean_ms": None}
    values = np.asarray(values_ms, dtype=np.float64)
    p50, p99 = percentiles(values, (50, 99))
    return {"count": int(values.size), "min_ms": round(float(values.min()), 2),
            "p50_ms": round(p50, 2), "p99_ms": round(p99, 2),
            "max_ms": round(float(values.max()), 2), "mean_ms": round(float(values.mean()), 2)}


def _between_ms(start_ms: float | None, end_ms: float | None) -> float | None:
    return None if start_ms is None or end_ms is None else end_ms - start_ms


def stage_split_ms(record: TrialRecord, stages: StageTimes) -> dict[str, float | None]:
    """Each stage's duration in ms (None where a timestamp is missing)."""
    recorded_ms = record.recorded_ns / NS_PER_MS
    applied_ms = None if record.applied_ns is None else record.applied_ns / NS_PER_MS
    points = (recorded_ms, stages.published_ms, stages.features_ms, stages.command_ms,
              applied_ms)
    return {name: _between_ms(start, end)
            for name, start, end in zip(STAGES, points[:-1], points[1:], strict=True)}


def reaction_figures(
    records: Sequence[TrialRecord], stages: dict[str, StageTimes]
) -> dict[str, object]:
    """The headline (from the probe publishing the crossing sample to the apply hook) and
    the same from the step being recorded, per-stage summaries and every trial's figure.
    Warm-up trials are left out."""
    measured = [r for r in records if not r.warmup]
    applied = [r for r in measured if r.applied_ns is not None]
    published_to_applied, recorded_to_applied = [], []
    split: dict[str, list[float]] = {name: [] for name in STAGES}
    for record in applied:
        times = stages.get(record.worker_id, StageTimes())
        assert record.applied_ns is not None
        applied_ms = record.applied_ns / NS_PER_MS
        recorded_to_applied.append(applied_ms - record.recorded_ns / NS_PER_MS)
        if times.published_ms is not None:
            published_to_applied.append(applied_ms - times.published_ms)
        for name, value in stage_split_ms(record, times).items():
            if value is not None:
                split[name].append(value)
    headline = summarise_ms(published_to_applied)
    return {
        "p50_ms": headline["p50_ms"],
        "p99_ms": headline["p99_ms"],
        "min_ms": headline["min_ms"],
        "max_ms": headline["max_ms"],
        "mean_ms": headline["mean_ms"],
        "trials": len(measured),
        "applied": len(applied),
        "missed": len(measured) - len(applied),
        "recorded_to_applied_ms": summarise_ms(recorded_to_applied),
        "stages_ms": {name: summarise_ms(values) for name, values in split.items()},
        "latencies_ms": [round(v, 2) for v in published_to_applied],
    }

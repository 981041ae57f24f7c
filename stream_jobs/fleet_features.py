"""Fleet features of one scope (a pool of a job, or a whole job) as pure functions: a
``FleetState`` and one ``FleetInput`` in, a new state out; a state and a time in, the
features over the window that ends then out.

The window is cut into buckets that hold sums (utilisation readings, trips,
interruptions, syncs, resumes, step time), so a scope's state stays the same size
however many workers report and however often. Cumulative worker totals are
differenced against the last total seen of that worker, which makes the result the same
whatever the batching, and a total seen again (a replay) adds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from dsec.schemas.fleet import FleetInput
from dsec.schemas.units import ms_to_s, s_to_ms

__all__ = [
    "Bucket", "FleetConfig", "FleetState", "WorkerTrack", "add_input", "fleet_features",
    "forget_departed", "window_name",
]

RECENT_INPUTS = 256  # input ids a scope remembers, so that a replayed input counts once


@dataclass(frozen=True)
class FleetConfig:
    """``window_s``: what the features cover (an hour: breaker trips and interruptions
    are counted in it, so compressing it compresses the hour); ``buckets``: its
    resolution; ``publish_interval_s``: how often a scope's features are published."""

    window_s: float = 3600.0
    buckets: int = 60
    publish_interval_s: float = 10.0

    @property
    def window_ms(self) -> int:
        return s_to_ms(self.window_s)

    @property
    def bucket_ms(self) -> int:
        return max(1, self.window_ms // self.buckets)


@dataclass(frozen=True, slots=True)
class Bucket:
    start_ms: int
    utilisation_sum: float = 0.0
    utilisation_readings: int = 0
    breaker_trips: int = 0
    interruptions: int = 0
    syncs: float = 0.0
    syncs_failed: float = 0.0
    snapshot_recoveries: float = 0.0
    snapshot_recovery_s: float = 0.0
    step_time_s: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkerTrack:
    """One worker of the scope: when it was first and last heard of, whether it is lost,
    whether its loss still waits for the resume that ends it (one interruption, not two),
    and the last of each cumulative total seen."""

    first_seen_ms: int
    last_seen_ms: int
    lost: bool = False
    awaiting_resume: bool = False
    totals: dict[str, float] = field(default_factory=dict)
    timed_steps: bool = False


@dataclass(frozen=True, slots=True)
class FleetState:
    workers: dict[str, WorkerTrack] = field(default_factory=dict)
    buckets: tuple[Bucket, ...] = ()
    recent_inputs: tuple[str, ...] = ()

    def to_bytes(self) -> bytes:
        return orjson.dumps({
            "workers": {w: _fields(t) for w, t in self.workers.items()},
            "buckets": [_fields(b) for b in self.buckets],
            "recent_inputs": list(self.recent_inputs),
        })

    @classmethod
    def from_bytes(cls, raw: bytes) -> FleetState:
        data = orjson.loads(raw)
        return cls(
            workers={w: WorkerTrack(**t) for w, t in data["workers"].items()},
            buckets=tuple(Bucket(**b) for b in data["buckets"]),
            recent_inputs=tuple(data["recent_inputs"]),
        )


def _fields(record: Any) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


def _added(track: WorkerTrack | None, readings: dict[str, float], name: str) -> float:
    """How much a cumulative total grew since the last one seen of the worker (a worker
    first seen brings all of it: its totals count from when the metrics job first saw it)."""
    if name not in readings:
        return 0.0
    before = track.totals.get(name, 0.0) if track is not None else 0.0
    return max(readings[name] - before, 0.0)


def _bucket_at(buckets: tuple[Bucket, ...], start_ms: int) -> tuple[int, Bucket]:
    for index in range(len(buckets) - 1, -1, -1):
        if buckets[index].start_ms == start_ms:
            return index, buckets[index]
        if buckets[index].start_ms < start_ms:
            break
    return -1, Bucket(start_ms=start_ms)


def _put(buckets: tuple[Bucket, ...], index: int, bucket: Bucket) -> tuple[Bucket, ...]:
    if index >= 0:
        return (*buckets[:index], bucket, *buckets[index + 1:])
    return tuple(sorted((*buckets, bucket), key=lambda b: b.start_ms))


def add_input(state: FleetState, item: FleetInput, config: FleetConfig) -> FleetState:
    """The scope's state with ``item`` counted (or as it was, for an input seen already)."""
    if item.event_id in state.recent_inputs:
        return state
    now_ms = item.event_time_ms
    worker = item.worker.worker_id
    track = state.workers.get(worker)
    readings = item.readings
    start_ms = now_ms - now_ms % config.bucket_ms
    index, bucket = _bucket_at(state.buckets, start_ms)
    interruptions = 0
    lost = track.lost if track else False
    awaiting = track.awaiting_resume if track else False
    if "worker_lost" in readings:
        now_lost = readings["worker_lost"] >= 1.0
        if now_lost and not lost:
            interruptions += 1
            awaiting = True
        lost = now_lost
    resumes = round(_added(track, readings, "recoveries_total"))
    if resumes and awaiting:
        resumes, awaiting = resumes - 1, False
    interruptions += resumes
    utilisation = readings.get("gpu_utilisation_pct")
    bucket = replace(
        bucket,
        utilisation_sum=bucket.utilisation_sum + (utilisation / 100.0 if utilisation is not None
                                                  else 0.0),
        utilisation_readings=bucket.utilisation_readings + (utilisation is not None),
        breaker_trips=bucket.breaker_trips + int(item.breaker_trip),
        interruptions=bucket.interruptions + interruptions,
        syncs=bucket.syncs + _added(track, readings, "grad_syncs_total"),
        syncs_failed=bucket.syncs_failed + _added(track, readings, "grad_syncs_failed_total"),
        snapshot_recoveries=bucket.snapshot_recoveries
        + _added(track, readings, "snapshot_recoveries_total"),
        snapshot_recovery_s=bucket.snapshot_recovery_s
        + _added(track, readings, "snapshot_recovery_time_s_total"),
        step_time_s=bucket.step_time_s + _added(track, readings, "step_time_s_total"),
    )
    totals = dict(track.totals) if track else {}
    for name, value in readings.items():
        if name.endswith("_total"):
            totals[name] = max(value, totals.get(name, value))
    new_track = WorkerTrack(
        first_seen_ms=min(track.first_seen_ms, now_ms) if track else now_ms,
        last_seen_ms=max(track.last_seen_ms, now_ms) if track else now_ms,
        lost=lost, awaiting_resume=awaiting, totals=totals,
        timed_steps=(track.timed_steps if track else False) or "step_time_s_total" in readings,
    )
    horizon_ms = now_ms - config.window_ms - config.bucket_ms
    buckets = tuple(b for b in _put(state.buckets, index, bucket) if b.start_ms >= horizon_ms)
    return FleetState(
        workers={**state.workers, worker: new_track}, buckets=buckets,
        recent_inputs=(*state.recent_inputs, item.event_id)[-RECENT_INPUTS:])


def forget_departed(state: FleetState, now_ms: int, config: FleetConfig) -> FleetState:
    """Without the workers not heard of for a whole window (gone, or lost that long) and
    the buckets that fell out of it."""
    horizon_ms = now_ms - config.window_ms
    workers = {w: t for w, t in state.workers.items() if t.last_seen_ms >= horizon_ms}
    buckets = tuple(b for b in state.buckets if b.start_ms + config.bucket_ms > horizon_ms)
    if len(workers) == len(state.workers) and len(buckets) == len(state.buckets):
        return state
    return replace(state, workers=workers, buckets=buckets)


def fleet_features(state: FleetState, now_ms: int, config: FleetConfig) -> dict[str, float]:
    """The scope's features over the window ending at ``now_ms`` (a bucket counts while
    any of it is inside). A feature without data in the window is left out."""
    horizon_ms = now_ms - config.window_ms
    inside = [b for b in state.buckets
              if b.start_ms + config.bucket_ms > horizon_ms and b.start_ms <= now_ms]
    out = {
        "breaker_trips_per_hour": float(sum(b.breaker_trips for b in inside)),
        "interruptions_per_hour": float(sum(b.interruptions for b in inside)),
    }
    readings = sum(b.utilisation_readings for b in inside)
    if readings:
        out["pool_utilisation_rate"] = sum(b.utilisation_sum for b in inside) / readings
    syncs = sum(b.syncs for b in inside)
    if syncs > 0:
        failed = sum(b.syncs_failed for b in inside)
        out["fleet_grad_sync_success_rate"] = max(0.0, 1.0 - failed / syncs)
    recoveries = sum(b.snapshot_recoveries for b in inside)
    if recoveries > 0:
        out["snapshot_recovery_time_s"] = sum(b.snapshot_recovery_s for b in inside) / recoveries
    wall_s = sum(
        ms_to_s(max(0.0, now_ms - max(track.first_seen_ms, horizon_ms)))
        for track in state.workers.values() if track.timed_steps
    )
    if wall_s > 0:
        productive_s = sum(b.step_time_s for b in inside)
        out["effective_training_time_ratio"] = min(1.0, productive_s / wall_s)
    return out


def window_name(window_s: float) -> str:
    """The window as the feature event names it: ``1h``, ``15m``, ``90s``."""
    for unit, seconds in (("h", 3600), ("m", 60)):
        if window_s >= seconds and window_s % seconds == 0:
            return f"{int(window_s // seconds)}{unit}"
    return f"{window_s:g}s"

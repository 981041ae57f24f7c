"""The personality job: GPU personalities and workload affinity from worker features and
GPU profiles.

No broker here: ``PersonalityJob`` takes decoded events and gives the events to publish
(the latest per key); the caller publishes them on the compacted topics and hands the
ones it reads back at start to ``restore``. The scores are pure functions.

What counts:
- an OOM: a rise of a worker's ``gpu_oom_total`` (a drop is a new process: its value
  counts whole);
- an interruption: a worker found lost (``worker_lost`` 0 -> 1), or a rise of its
  ``recoveries_total`` that no loss explained;
- observed time: the gap between a worker's consecutive feature events, capped, so a
  silent stretch is not counted as time run;
- stable time (per workload and model): observed time in which neither happened.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from dsec.schemas import FeatureEvent, GpuProfileEvent
from dsec.schemas.placement import (
    GpuPersonalityEvent,
    PersonalityRegime,
    RegimeStats,
    WorkloadAffinityEvent,
)
from dsec.schemas.units import ms_to_s

__all__ = [
    "PersonalityConfig", "PersonalityJob", "regime_of", "stability_score", "workload_of",
]

REGIMES: tuple[PersonalityRegime, ...] = ("short", "medium", "long")
WORKLOAD_LABEL = "workload"


@dataclass(frozen=True)
class PersonalityConfig:
    # Episode lengths (steps) between regimes, as the metrics job buckets GPU profiles.
    regime_bounds_steps: tuple[float, float] = (100.0, 300.0)
    # The longest gap between two feature events of a worker counted as time observed.
    max_gap_s: float = 60.0
    # A leak at this rate costs half the score: a card that fills 80 GiB in a day.
    leak_half_score_bytes_per_s: float = 1 << 20
    # Incidents per hour at which the score halves.
    incidents_half_score_per_h: float = 0.5
    # Hours observed at which confidence reaches one half.
    confidence_half_h: float = 1.0
    throttle_event_weight: float = 0.05


def regime_of(episode_length_steps: float | None, config: PersonalityConfig) -> PersonalityRegime:
    if episode_length_steps is None:
        return "all"
    low, high = config.regime_bounds_steps
    if episode_length_steps < low:
        return "short"
    return "medium" if episode_length_steps < high else "long"


def workload_of(event: FeatureEvent) -> str:
    """A declared workload class label, else the pool, else the job."""
    labels = event.identity.labels or {}
    return labels.get(WORKLOAD_LABEL) or event.target_pool() or event.identity.job_id


def stability_score(stats: RegimeStats, config: PersonalityConfig) -> float:
    """1 for a long clean record; halves at ``incidents_half_score_per_h`` and again at
    ``leak_half_score_bytes_per_s``. With little time observed, the incidents are spread
    over one hour at least, so one early OOM does not read as a catastrophe."""
    hours = max(stats.observed_s / 3600.0, 1.0)
    incidents = (stats.ooms + stats.interruptions
                 + config.throttle_event_weight * stats.throttle_events)
    incident_factor = 1.0 / (1.0 + incidents / hours / config.incidents_half_score_per_h)
    leak = max(stats.leak_bytes_per_s, 0.0)
    leak_factor = 1.0 / (1.0 + leak / config.leak_half_score_bytes_per_s)
    return round(incident_factor * leak_factor, 6)


def confidence(observed_s: float, config: PersonalityConfig) -> float:
    hours = observed_s / 3600.0
    return round(hours / (hours + config.confidence_half_h), 6)


@dataclass
class _Counters:
    ooms: int = 0
    interruptions: int = 0
    throttle_events: int = 0
    observed_s: float = 0.0
    feature_events: int = 0
    workers: set[str] = field(default_factory=set)
    # Workers counted before a restart (only how many is published): one seen again after
    # it counts twice, so after a restart the count is an upper bound.
    workers_before: int = 0


@dataclass
class _Gpu:
    gpu_model: str = ""
    node_id: str = ""
    pool: str = ""
    first_seen_ms: int = 0
    last_seen_ms: int = 0
    regimes: dict[str, _Counters] = field(default_factory=dict)
    # (worker) -> its latest cumulative GPU profile on this GPU
    profiles: dict[str, GpuProfileEvent] = field(default_factory=dict)

    def counters(self, regime: str) -> _Counters:
        return self.regimes.setdefault(regime, _Counters())


@dataclass
class _Affinity:
    ooms: int = 0
    interruptions: int = 0
    stable_s: float = 0.0
    observed_s: float = 0.0
    first_seen_ms: int = 0
    last_seen_ms: int = 0


@dataclass
class _Worker:
    last_ms: int
    oom_total: float = 0.0
    recoveries_total: float = 0.0
    lost: bool = False


class PersonalityJob:
    def __init__(self, config: PersonalityConfig | None = None) -> None:
        self.config = config or PersonalityConfig()
        self._gpus: dict[str, _Gpu] = {}
        self._affinity: dict[tuple[str, str], _Affinity] = {}
        self._workers: dict[tuple[str, str], _Worker] = {}
        self._dirty_gpus: set[str] = set()
        self._dirty_affinity: set[tuple[str, str]] = set()

    # -- input -------------------------------------------------------------------------
    def add_features(self, event: FeatureEvent) -> None:
        if event.scope != "worker" or not event.gpu_uuid:
            return
        values, at_ms = event.features, event.event_time_ms
        gpu = self._gpus.setdefault(event.gpu_uuid, _Gpu(first_seen_ms=at_ms))
        gpu.gpu_model = event.tags.get("gpu_model", gpu.gpu_model)
        gpu.node_id = event.identity.node_id
        gpu.pool = event.target_pool() or gpu.pool
        gpu.first_seen_ms = min(gpu.first_seen_ms or at_ms, at_ms)
        gpu.last_seen_ms = max(gpu.last_seen_ms, at_ms)
        worker_key = (event.identity.job_id, event.identity.worker_id)
        before = self._workers.get(worker_key)
        ooms, interruptions, gap_s, worker = self._incidents(before, values, at_ms)
        self._workers[worker_key] = worker
        regime = regime_of(values.get("episode_length_mean"), self.config)
        throttles = int(values.get("gpu_thermal_throttle_events", 0.0))
        for name in {regime, "all"}:
            counters = gpu.counters(name)
            counters.ooms += ooms
            counters.interruptions += interruptions
            counters.throttle_events += throttles
            counters.observed_s += gap_s
            counters.feature_events += 1
            counters.workers.add(event.identity.worker_id)
        self._dirty_gpus.add(event.gpu_uuid)
        if gpu.gpu_model:
            key = (workload_of(event), gpu.gpu_model)
            affinity = self._affinity.setdefault(key, _Affinity(first_seen_ms=at_ms))
            affinity.ooms += ooms
            affinity.interruptions += interruptions
            affinity.observed_s += gap_s
            if ooms == 0 and interruptions == 0:
                affinity.stable_s += gap_s
            affinity.last_seen_ms = max(affinity.last_seen_ms, at_ms)
            self._dirty_affinity.add(key)

    def _incidents(self, before: _Worker | None, values: dict[str, float],
                   at_ms: int) -> tuple[int, int, float, _Worker]:
        if before is None:
            # A first sight (or the first after a restart of this job) sets the baseline.
            return 0, 0, 0.0, _Worker(at_ms, values.get("gpu_oom_total", 0.0),
                                      values.get("recoveries_total", 0.0),
                                      values.get("worker_lost", 0.0) >= 1.0)
        gap_s = min(ms_to_s(max(at_ms - before.last_ms, 0)), self.config.max_gap_s)
        ooms = interruptions = 0
        oom_total = values.get("gpu_oom_total", before.oom_total)
        if oom_total > before.oom_total:
            ooms = int(oom_total - before.oom_total)
        elif oom_total < before.oom_total:
            ooms = int(oom_total)
        lost = values.get("worker_lost", 1.0 if before.lost else 0.0) >= 1.0
        if lost and not before.lost:
            interruptions += 1
            gap_s = 0.0
        recoveries = values.get("recoveries_total", before.recoveries_total)
        if recoveries > before.recoveries_total and not before.lost:
            interruptions += int(recoveries - before.recoveries_total)
        return ooms, interruptions, gap_s, _Worker(at_ms, oom_total, recoveries, lost)

    def add_profile(self, profile: GpuProfileEvent) -> None:
        gpu = self._gpus.setdefault(profile.gpu_uuid,
                                    _Gpu(first_seen_ms=profile.event_time_ms))
        gpu.gpu_model = profile.gpu_model or gpu.gpu_model
        gpu.node_id = gpu.node_id or profile.identity.node_id
        gpu.last_seen_ms = max(gpu.last_seen_ms, profile.event_time_ms)
        held = gpu.profiles.get(profile.identity.worker_id)
        if held is None or held.event_time_ms <= profile.event_time_ms:
            gpu.profiles[profile.identity.worker_id] = profile
        self._dirty_gpus.add(profile.gpu_uuid)

    def restore(self, events: Iterable[GpuPersonalityEvent | WorkloadAffinityEvent]) -> None:
        """Counters as last published (read back from the compacted topics at start): the
        job goes on from them instead of from zero. Leak rates come back with the GPU
        profiles, which are compacted too."""
        for event in events:
            if isinstance(event, WorkloadAffinityEvent):
                self._affinity[(event.workload, event.gpu_model)] = _Affinity(
                    event.ooms, event.interruptions, event.stable_s, event.observed_s,
                    event.first_seen_ms, event.last_seen_ms)
            elif event.scope == "gpu":
                gpu = self._gpus.setdefault(event.gpu_uuid, _Gpu())
                gpu.gpu_model, gpu.node_id, gpu.pool = event.gpu_model, event.node_id, event.pool
                gpu.first_seen_ms, gpu.last_seen_ms = event.first_seen_ms, event.last_seen_ms
                for regime, stats in event.regimes.items():
                    gpu.regimes[regime] = _Counters(
                        stats.ooms, stats.interruptions, stats.throttle_events,
                        stats.observed_s, stats.feature_events, workers_before=stats.workers)

    # -- output ------------------------------------------------------------------------
    def take_changes(self, now_ms: int) -> list[GpuPersonalityEvent | WorkloadAffinityEvent]:
        """The events of every GPU, model and workload changed since the last call."""
        out: list[GpuPersonalityEvent | WorkloadAffinityEvent] = []
        models = {self._gpus[uuid].gpu_model for uuid in self._dirty_gpus
                  if self._gpus[uuid].gpu_model}
        for uuid in sorted(self._dirty_gpus):
            out.append(self._gpu_event(uuid, self._gpus[uuid], now_ms))
        for model in sorted(models):
            out.append(self._model_event(model, now_ms))
        for key in sorted(self._dirty_affinity):
            affinity = self._affinity[key]
            out.append(WorkloadAffinityEvent(
                event_time_ms=now_ms, workload=key[0], gpu_model=key[1], ooms=affinity.ooms,
                interruptions=affinity.interruptions, stable_s=round(affinity.stable_s, 3),
                observed_s=round(affinity.observed_s, 3),
                first_seen_ms=affinity.first_seen_ms, last_seen_ms=affinity.last_seen_ms))
        self._dirty_gpus.clear()
        self._dirty_affinity.clear()
        return out

    def _regime_stats(self, gpus: list[_Gpu]) -> dict[str, RegimeStats]:
        stats: dict[str, RegimeStats] = {}
        for regime in (*REGIMES, "all"):
            counters = [gpu.regimes[regime] for gpu in gpus if regime in gpu.regimes]
            grown_bytes = grown_s = 0.0
            jitter = 0.0
            for gpu in gpus:
                for profile in gpu.profiles.values():
                    jitter = max(jitter, profile.bandwidth_jitter)
                    for name, growth in profile.regimes.items():
                        if regime in (name, "all"):
                            grown_bytes += growth.delta_bytes
                            grown_s += growth.delta_s
            if not counters and grown_s == 0:
                continue
            stats[regime] = RegimeStats(
                leak_bytes_per_s=round(grown_bytes / grown_s, 3) if grown_s > 0 else 0.0,
                leak_observed_s=round(grown_s, 3),
                bandwidth_jitter=round(jitter, 6),
                throttle_events=sum(c.throttle_events for c in counters),
                ooms=sum(c.ooms for c in counters),
                interruptions=sum(c.interruptions for c in counters),
                observed_s=round(sum(c.observed_s for c in counters), 3),
                workers=(len(set().union(*(c.workers for c in counters)))
                         + max((c.workers_before for c in counters), default=0)),
                feature_events=sum(c.feature_events for c in counters))
        return stats

    def _event(self, gpus: list[_Gpu], now_ms: int, **identity: str) -> GpuPersonalityEvent:
        regimes = self._regime_stats(gpus)
        observed_s = regimes["all"].observed_s if "all" in regimes else 0.0
        return GpuPersonalityEvent(
            event_time_ms=now_ms, regimes=regimes,
            stability_score={name: stability_score(stats, self.config)
                             for name, stats in regimes.items()},
            confidence=confidence(observed_s, self.config),
            first_seen_ms=min(gpu.first_seen_ms for gpu in gpus),
            last_seen_ms=max(gpu.last_seen_ms for gpu in gpus), **identity)

    def _gpu_event(self, uuid: str, gpu: _Gpu, now_ms: int) -> GpuPersonalityEvent:
        return self._event([gpu], now_ms, scope="gpu", gpu_uuid=uuid, gpu_model=gpu.gpu_model,
                           node_id=gpu.node_id, pool=gpu.pool)

    def _model_event(self, model: str, now_ms: int) -> GpuPersonalityEvent:
        gpus = [gpu for gpu in self._gpus.values() if gpu.gpu_model == model]
        return self._event(gpus, now_ms, scope="model", gpu_model=model)

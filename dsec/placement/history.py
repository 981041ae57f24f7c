"""What placement knows, read from the store: the latest GPU and model personalities,
workload affinity, GPU health and topology."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dsec.schemas.alerts import GpuHealthEvent
from dsec.schemas.placement import GpuPersonalityEvent, GpuTopologyEvent, WorkloadAffinityEvent

__all__ = ["GpuHealth", "GpuRecord", "ModelAffinity", "PlacementHistory", "Query",
           "history_from_events", "read_history"]

# A read-only query: ``{"columns": [...], "rows": [[...], ...]}``.
Query = Callable[[str], dict]


@dataclass(frozen=True)
class GpuRecord:
    """One GPU's personality (or one model's, ``gpu_uuid`` empty) in every regime seen."""

    gpu_uuid: str
    gpu_model: str
    node_id: str = ""
    pool: str = ""
    confidence: float = 0.0
    # regime -> the row's values: stability_score, leak_bytes_per_s, ooms, ...
    regimes: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelAffinity:
    ooms: int = 0
    interruptions: int = 0
    stable_s: float = 0.0
    observed_s: float = 0.0


@dataclass(frozen=True)
class GpuHealth:
    state: str
    since_ms: int
    signal: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Topology:
    node_id: str
    gpu_model: str
    numa_node: int
    cpu_affinity: tuple[int, ...]
    links: dict[str, str]


@dataclass
class PlacementHistory:
    gpus: dict[str, GpuRecord] = field(default_factory=dict)
    models: dict[str, GpuRecord] = field(default_factory=dict)
    affinity: dict[tuple[str, str], ModelAffinity] = field(default_factory=dict)
    health: dict[str, GpuHealth] = field(default_factory=dict)
    topology: dict[str, Topology] = field(default_factory=dict)


_STATS = ("stability_score", "leak_bytes_per_s", "leak_observed_s", "bandwidth_jitter",
          "throttle_events", "ooms", "interruptions", "observed_s", "workers",
          "feature_events")

PERSONALITIES_SQL = f"""
SELECT scope, gpu_uuid, gpu_model, node_id, pool, regime, confidence, {", ".join(_STATS)}
FROM gpu_personalities FINAL
"""
AFFINITY_SQL = """
SELECT workload, gpu_model, ooms, interruptions, stable_s, observed_s
FROM workload_affinity FINAL
"""
# The latest change per GPU; the event time orders them (a replay keeps its order).
HEALTH_SQL = """
SELECT gpu_uuid, argMax(state, event_time), toUnixTimestamp64Milli(argMax(since, event_time)),
       argMax(signal, event_time), argMax(reason, event_time)
FROM gpu_health GROUP BY gpu_uuid
"""
TOPOLOGY_SQL = """
SELECT gpu_uuid, node_id, gpu_model, numa_node, cpu_affinity, mapKeys(links), mapValues(links)
FROM gpu_topology FINAL
"""


def read_history(query: Query) -> PlacementHistory:
    history = PlacementHistory()
    grouped: dict[tuple[str, str], dict] = {}
    for row in query(PERSONALITIES_SQL)["rows"]:
        scope, uuid, model, node, pool, regime, confidence, *stats = row
        key = (scope, uuid if scope == "gpu" else model)
        entry = grouped.setdefault(key, {"uuid": uuid, "model": model, "node": node,
                                         "pool": pool, "confidence": float(confidence),
                                         "regimes": {}})
        entry["regimes"][regime] = {name: float(value)
                                    for name, value in zip(_STATS, stats, strict=True)}
    for (scope, name), entry in grouped.items():
        record = GpuRecord(entry["uuid"], entry["model"], entry["node"], entry["pool"],
                           entry["confidence"], entry["regimes"])
        (history.gpus if scope == "gpu" else history.models)[name] = record
    for workload, model, ooms, interruptions, stable_s, observed_s in query(AFFINITY_SQL)["rows"]:
        history.affinity[(workload, model)] = ModelAffinity(
            int(ooms), int(interruptions), float(stable_s), float(observed_s))
    for uuid, state, since_ms, signal, reason in query(HEALTH_SQL)["rows"]:
        history.health[uuid] = GpuHealth(state, int(since_ms), signal, reason)
    for uuid, node, model, numa, cpus, peers, kinds in query(TOPOLOGY_SQL)["rows"]:
        history.topology[uuid] = Topology(node, model, int(numa), tuple(int(c) for c in cpus),
                                          dict(zip(peers, kinds, strict=True)))
    return history


PlacementEvent = GpuPersonalityEvent | WorkloadAffinityEvent | GpuHealthEvent | GpuTopologyEvent


def history_from_events(events: Iterable[PlacementEvent]) -> PlacementHistory:
    """The history from the events themselves (the compacted topics read whole, or a
    simulation's), the latest per key winning as the store's ``FINAL`` has it."""
    history = PlacementHistory()
    for event in sorted(events, key=lambda e: e.event_time_ms):
        if isinstance(event, GpuPersonalityEvent):
            record = GpuRecord(
                event.gpu_uuid, event.gpu_model, event.node_id, event.pool, event.confidence,
                {regime: {**stats.model_dump(),
                          "stability_score": event.stability_score.get(regime, 0.0)}
                 for regime, stats in event.regimes.items()})
            if event.scope == "gpu":
                history.gpus[event.gpu_uuid] = record
            else:
                history.models[event.gpu_model] = record
        elif isinstance(event, WorkloadAffinityEvent):
            history.affinity[(event.workload, event.gpu_model)] = ModelAffinity(
                event.ooms, event.interruptions, event.stable_s, event.observed_s)
        elif isinstance(event, GpuHealthEvent):
            history.health[event.gpu_uuid] = GpuHealth(event.state, event.since_ms,
                                                       event.signal, event.reason)
        else:
            history.topology[event.gpu_uuid] = Topology(
                event.node_id, event.gpu_model, event.numa_node, tuple(event.cpu_affinity),
                dict(event.links))
    return history

"""The recommendation: every known GPU filtered or scored, each with the history rows
behind it, and the ``count`` GPUs to use together. Pure: history in, answer out.

A GPU's score is the product of factors, each one a ``Reason``:
- its personality in the workload's regime (its own record, blended with its model's
  while it has little time of its own there);
- the workload's affinity with the GPU's model: OOMs and interruptions there divide it,
  stable hours there raise it.
A degraded GPU is filtered, and stays filtered until it has been healthy for
``hold_s``. A group of GPUs scores its mean, plus a bonus when communicating workers
share a NUMA node and NVLink.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from dsec.placement.history import GpuRecord, PlacementHistory
from dsec.schemas.placement import (
    FilteredGpu,
    RankedGpu,
    Reason,
    Recommendation,
    RecommendRequest,
)
from dsec.schemas.units import ms_to_s

__all__ = ["PlacementConfig", "recommend"]


@dataclass(frozen=True)
class PlacementConfig:
    # How long a GPU that was degraded must stay healthy before it is offered again.
    hold_s: float = 600.0
    # Each OOM of the workload on a model divides that model's factor by (1 + this).
    oom_penalty: float = 1.0
    interruption_penalty: float = 0.5
    # Stable hours of the workload on a model raise its factor by up to this share.
    stable_bonus: float = 0.2
    stable_bonus_full_h: float = 4.0
    # Seconds of a card's own record in a regime at which it weighs as much as its
    # model's record there.
    model_prior_s: float = 60.0
    # A GPU with no record scores this (unknown is neither good nor bad).
    unknown_score: float = 0.5
    numa_bonus: float = 0.1
    nvlink_bonus: float = 0.1


def _personality_factor(gpu: GpuRecord | None, model: GpuRecord | None, regime: str,
                        config: PlacementConfig) -> tuple[float, list[Reason]]:
    reasons: list[Reason] = []

    def row(record: GpuRecord, source_key: str) -> float | None:
        name = regime if regime in record.regimes else "all"
        stats = record.regimes.get(name)
        if stats is None:
            return None
        reasons.append(Reason(
            source="gpu_personalities", key=f"{source_key}/{name}",
            detail=(f"stability {stats['stability_score']:.3f}: leak "
                    f"{stats['leak_bytes_per_s']:.0f} B/s over {stats['leak_observed_s']:.0f} s, "
                    f"{stats['ooms']:.0f} OOMs, {stats['interruptions']:.0f} interruptions, "
                    f"{stats['throttle_events']:.0f} throttle events in "
                    f"{stats['observed_s'] / 3600:.2f} h from {stats['workers']:.0f} workers"),
            effect=stats["stability_score"]))
        return stats["stability_score"]

    own = row(gpu, f"gpu:{gpu.gpu_uuid}") if gpu is not None else None
    own_stats = None if gpu is None else gpu.regimes.get(
        regime if regime in gpu.regimes else "all")
    of_model = row(model, f"model:{model.gpu_model}") if model is not None else None
    if own is None and of_model is None:
        return config.unknown_score, [Reason(
            source="gpu_personalities", key="-", detail="no record of this GPU or its model",
            effect=config.unknown_score)]
    if own is None:
        return float(of_model), reasons  # type: ignore[arg-type]
    if of_model is None:
        return own, reasons
    # The model's record is the prior of a card with little time of its own in the regime.
    own_s = (own_stats["observed_s"] + own_stats["leak_observed_s"]) if own_stats else 0.0
    weight = own_s / (own_s + config.model_prior_s)
    return weight * own + (1.0 - weight) * of_model, reasons


def _affinity_factor(history: PlacementHistory, workload: str, gpu_model: str,
                     config: PlacementConfig) -> tuple[float, list[Reason]]:
    affinity = history.affinity.get((workload, gpu_model))
    if affinity is None:
        return 1.0, []
    stable_h = affinity.stable_s / 3600.0
    bonus = config.stable_bonus * min(stable_h / config.stable_bonus_full_h, 1.0)
    factor = (1.0 + bonus) / (1.0 + config.oom_penalty * affinity.ooms
                              + config.interruption_penalty * affinity.interruptions)
    return factor, [Reason(
        source="workload_affinity", key=f"{workload}/{gpu_model}",
        detail=(f"{affinity.ooms} OOMs, {affinity.interruptions} interruptions, "
                f"{stable_h:.2f} stable h of {affinity.observed_s / 3600:.2f} h on {gpu_model}"),
        effect=round(factor, 6))]


def _filtered_why(history: PlacementHistory, uuid: str, pool: str, request: RecommendRequest,
                  now_ms: int, config: PlacementConfig) -> str | None:
    if request.pool is not None and pool != request.pool:
        return f"in pool {pool or '(none)'}, not {request.pool}"
    health = history.health.get(uuid)
    if health is None:
        return None
    if health.state == "degraded":
        return (f"degraded since {health.since_ms} (gpu_health: {health.signal}"
                f"{': ' + health.reason if health.reason else ''})")
    healthy_s = ms_to_s(now_ms - health.since_ms)
    if healthy_s < config.hold_s:
        return (f"healthy for {max(healthy_s, 0):.0f} s of the {config.hold_s:.0f} s hold "
                f"after being degraded (gpu_health: {health.signal})")
    return None


def recommend(history: PlacementHistory, request: RecommendRequest, now_ms: int,
              config: PlacementConfig | None = None) -> Recommendation:
    config = config or PlacementConfig()
    uuids = sorted(set(history.gpus) | set(history.topology))
    ranked: list[RankedGpu] = []
    filtered: list[FilteredGpu] = []
    for uuid in uuids:
        gpu = history.gpus.get(uuid)
        topology = history.topology.get(uuid)
        model = (gpu.gpu_model if gpu else "") or (topology.gpu_model if topology else "")
        node = (gpu.node_id if gpu else "") or (topology.node_id if topology else "")
        why = _filtered_why(history, uuid, gpu.pool if gpu else "", request, now_ms, config)
        if why is not None:
            filtered.append(FilteredGpu(gpu_uuid=uuid, gpu_model=model, node_id=node, why=why))
            continue
        personality, reasons = _personality_factor(gpu, history.models.get(model),
                                                   request.regime, config)
        affinity, affinity_reasons = _affinity_factor(history, request.workload, model, config)
        ranked.append(RankedGpu(
            gpu_uuid=uuid, gpu_model=model, node_id=node,
            numa_node=topology.numa_node if topology else -1,
            score=round(personality * affinity, 6), reasons=[*reasons, *affinity_reasons]))
    ranked.sort(key=lambda r: (-r.score, r.gpu_uuid))
    chosen, chosen_reasons = _choose(history, ranked, request, config)
    return Recommendation(workload=request.workload, count=request.count, ranked=ranked,
                          filtered=filtered, chosen=chosen, chosen_reasons=chosen_reasons,
                          at_ms=now_ms)


def _choose(history: PlacementHistory, ranked: list[RankedGpu], request: RecommendRequest,
            config: PlacementConfig) -> tuple[list[str], list[Reason]]:
    """The best group of ``count``: the top ``count`` of the fleet, of each node, and of
    each NUMA node of each node, each scored by its mean plus the topology bonuses."""
    count = request.count
    if len(ranked) < count:
        return [], [Reason(source="placement", key="-", effect=0.0,
                           detail=f"{len(ranked)} usable GPUs for {count} asked")]
    if count == 1:
        return [ranked[0].gpu_uuid], []
    candidates: list[list[RankedGpu]] = [ranked[:count]]
    by_group: dict[tuple, list[RankedGpu]] = {}
    for gpu in ranked:  # already best first
        by_group.setdefault((gpu.node_id,), []).append(gpu)
        if gpu.numa_node >= 0:
            by_group.setdefault((gpu.node_id, gpu.numa_node), []).append(gpu)
    candidates += [members[:count] for members in by_group.values() if len(members) >= count]
    best: tuple[float, list[RankedGpu], list[Reason]] | None = None
    for group in candidates:
        score, reasons = _group_score(history, group, request, config)
        if best is None or score > best[0] + 1e-12:
            best = (score, group, reasons)
    assert best is not None
    return [gpu.gpu_uuid for gpu in best[1]], best[2]


def _group_score(history: PlacementHistory, group: list[RankedGpu], request: RecommendRequest,
                 config: PlacementConfig) -> tuple[float, list[Reason]]:
    mean = sum(gpu.score for gpu in group) / len(group)
    reasons = [Reason(source="placement", key="mean", detail="mean score of the group",
                      effect=round(mean, 6))]
    if not request.communicating:
        return mean, reasons
    score = mean
    nodes = {gpu.node_id for gpu in group}
    numas = {(gpu.node_id, gpu.numa_node) for gpu in group}
    if len(nodes) == 1 and len(numas) == 1 and group[0].numa_node >= 0:
        score += config.numa_bonus
        reasons.append(Reason(source="gpu_topology", key=f"{group[0].node_id}/numa"
                              f"{group[0].numa_node}", detail="one node, one NUMA node",
                              effect=config.numa_bonus))
    pairs = list(combinations(group, 2))
    linked = sum(1 for a, b in pairs
                 if history.topology.get(a.gpu_uuid) is not None
                 and history.topology[a.gpu_uuid].links.get(b.gpu_uuid) == "nvlink")
    if pairs and linked:
        bonus = config.nvlink_bonus * linked / len(pairs)
        score += bonus
        reasons.append(Reason(source="gpu_topology", key=",".join(g.gpu_uuid for g in group),
                              detail=f"{linked} of {len(pairs)} pairs linked by NVLink",
                              effect=round(bonus, 6)))
    return score, reasons

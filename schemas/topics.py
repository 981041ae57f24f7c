"""Every Kafka topic dsec uses, with its settings, in one place."""

from __future__ import annotations

from dataclasses import dataclass

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True)
class TopicSpec:
    role: str
    suffix: str
    partitions: int
    retention_ms: int
    compacted: bool = False
    key: str = ""

    def name(self, prefix: str = "dsec") -> str:
        return f"{prefix}.{self.suffix}"

    def config(self) -> dict[str, str]:
        if self.compacted:
            return {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
        return {"cleanup.policy": "delete", "retention.ms": str(self.retention_ms)}


TOPICS: dict[str, TopicSpec] = {
    spec.role: spec
    for spec in (
        TopicSpec("metrics", "metrics.v1", 6, DAY_MS, key="worker_id"),
        TopicSpec("features", "features.v1", 6, 3 * DAY_MS, key="worker_id"),
        TopicSpec("gpu_profiles", "gpu-profiles.v1", 6, -1, compacted=True,
                  key="gpu_uuid/worker_id"),
        TopicSpec("gpu_cards", "gpu-cards.v1", 6, DAY_MS, key="gpu_uuid"),
        TopicSpec("policies", "policies.v1", 1, -1, compacted=True, key="policy name"),
        TopicSpec("pools", "pools.v1", 1, -1, compacted=True, key="pool name"),
        TopicSpec("actuations", "actuations.v1", 6, DAY_MS, key="node_id"),
        TopicSpec("actuation_results", "actuation-results.v1", 6, 7 * DAY_MS, key="node_id"),
        TopicSpec("decisions", "policy-decisions.v1", 3, 7 * DAY_MS, key="policy name"),
        TopicSpec("dead_letters", "dead-letters.v1", 1, 7 * DAY_MS, key="source topic"),
        # The fleet job's input: each worker's contribution, re-keyed by its job and pool
        # so that one pool's workers meet in one partition.
        TopicSpec("fleet_inputs", "fleet-inputs.v1", 6, DAY_MS, key="job_id/pool"),
        TopicSpec("alerts", "alerts.v1", 3, -1, compacted=True, key="alert fingerprint"),
        TopicSpec("gpu_health", "gpu-health.v1", 3, -1, compacted=True, key="gpu_uuid"),
        TopicSpec("process_usage", "process-usage.v1", 1, 7 * DAY_MS, key="service/host"),
        # Placement's history: compacted, so a restarted service reads the latest at once.
        TopicSpec("gpu_personalities", "gpu-personalities.v1", 3, -1, compacted=True,
                  key="gpu:<uuid> | model:<model>"),
        TopicSpec("workload_affinity", "workload-affinity.v1", 3, -1, compacted=True,
                  key="workload/gpu_model"),
        TopicSpec("gpu_topology", "gpu-topology.v1", 1, -1, compacted=True, key="gpu_uuid"),
    )
}


@dataclass(frozen=True)
class TopicNames:
    metrics: str
    features: str
    gpu_profiles: str
    gpu_cards: str
    policies: str
    pools: str
    actuations: str
    actuation_results: str
    decisions: str
    dead_letters: str
    fleet_inputs: str
    alerts: str
    gpu_health: str
    process_usage: str
    gpu_personalities: str
    workload_affinity: str
    gpu_topology: str


def topic_names(prefix: str = "dsec") -> TopicNames:
    return TopicNames(**{role: spec.name(prefix) for role, spec in TOPICS.items()})

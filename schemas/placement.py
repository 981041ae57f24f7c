"""Placement's contract: GPU personalities, workload affinity, GPU topology (each on a
compacted topic, so a restarted service has it at once), and the recommendation API.

A ``GpuPersonalityEvent`` is the running record of one GPU (``scope="gpu"``) or one GPU
model (``scope="model"``) per workload regime; a ``WorkloadAffinityEvent`` is how one
workload fared on one GPU model; a ``GpuTopologyEvent`` is what NVML says of one GPU's
place on its node (read once: topology is static).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dsec.schemas.base import Count, EpochMs, Event, Identifier, Model

GpuModel = Annotated[str, Field(max_length=128)]
# Episode-length regimes (as the GPU profiles bucket them), and "all" of them together.
PersonalityRegime = Literal["short", "medium", "long", "all"]
PersonalityScope = Literal["gpu", "model"]
# What links two GPUs of one node, best first, as nvmlDeviceGetTopologyCommonAncestor and
# the NVLink state say it.
LinkKind = Literal["nvlink", "board", "pcie_switch", "pcie_multi", "host_bridge", "node",
                   "system"]


class RegimeStats(Model):
    """What one GPU (or model) did in one regime, with the evidence behind it."""

    leak_bytes_per_s: float = 0.0
    leak_observed_s: Annotated[float, Field(ge=0)] = 0.0
    bandwidth_jitter: Annotated[float, Field(ge=0)] = 0.0
    throttle_events: Count = 0
    ooms: Count = 0
    interruptions: Count = 0
    observed_s: Annotated[float, Field(ge=0)] = 0.0
    workers: Count = 0
    feature_events: Count = 0


class GpuPersonalityEvent(Event):
    """``stability_score`` in 0..1 (1: nothing went wrong over a long record) per regime,
    ``confidence`` in 0..1 grows with the hours observed."""

    scope: PersonalityScope
    gpu_uuid: Annotated[str, Field(max_length=128)] = ""
    gpu_model: GpuModel = ""
    node_id: Annotated[str, Field(max_length=128)] = ""
    pool: Annotated[str, Field(max_length=128)] = ""
    regimes: dict[PersonalityRegime, RegimeStats]
    stability_score: dict[PersonalityRegime, Annotated[float, Field(ge=0, le=1)]]
    confidence: Annotated[float, Field(ge=0, le=1)] = 0.0
    first_seen_ms: EpochMs
    last_seen_ms: EpochMs

    def key(self) -> str:
        return f"gpu:{self.gpu_uuid}" if self.scope == "gpu" else f"model:{self.gpu_model}"


class WorkloadAffinityEvent(Event):
    """How ``workload`` (a workload class label, else its pool, else its job) fared on
    ``gpu_model``: cumulative since first seen."""

    workload: Identifier
    gpu_model: GpuModel
    ooms: Count = 0
    interruptions: Count = 0
    stable_s: Annotated[float, Field(ge=0)] = 0.0
    observed_s: Annotated[float, Field(ge=0)] = 0.0
    first_seen_ms: EpochMs
    last_seen_ms: EpochMs

    def key(self) -> str:
        return f"{self.workload}/{self.gpu_model}"


class GpuTopologyEvent(Event):
    """One GPU's place on its node: NUMA node (-1 where NVML has none), the CPUs close to
    it, and what links it to each other GPU of the node (by UUID)."""

    node_id: Identifier
    gpu_uuid: Identifier
    gpu_model: GpuModel = ""
    gpu_index: Annotated[int, Field(ge=0, le=1024)]
    numa_node: Annotated[int, Field(ge=-1, le=1024)] = -1
    cpu_affinity: Annotated[list[Annotated[int, Field(ge=0, le=65535)]],
                            Field(max_length=4096)] = Field(default_factory=list)
    links: Annotated[dict[Identifier, LinkKind], Field(max_length=256)] = Field(
        default_factory=dict)
    nvlink_active: Annotated[int, Field(ge=0, le=64)] = 0


# -- the recommendation API ----------------------------------------------------------------

class RecommendRequest(Model):
    workload: Identifier
    count: Annotated[int, Field(ge=1, le=1024)] = 1
    pool: Identifier | None = None
    regime: PersonalityRegime = "all"
    # Workers that talk a lot (an actor/learner group): keep them on one NUMA node and on
    # directly linked GPUs where the fleet allows it.
    communicating: bool = False


class Reason(Model):
    """One piece of evidence: the table and key of the history row, what it says, and
    what it did to the score."""

    source: Annotated[str, Field(max_length=64)]
    key: Annotated[str, Field(max_length=256)]
    detail: Annotated[str, Field(max_length=1024)]
    effect: float = 0.0


class RankedGpu(Model):
    gpu_uuid: str
    gpu_model: str
    node_id: str
    numa_node: int = -1
    score: float
    reasons: list[Reason]


class FilteredGpu(Model):
    gpu_uuid: str
    gpu_model: str
    node_id: str
    why: str


class Recommendation(Model):
    workload: str
    count: int
    ranked: list[RankedGpu]
    filtered: list[FilteredGpu]
    # The ``count`` GPUs chosen together (topology considered), best group first.
    chosen: list[str]
    chosen_reasons: list[Reason] = Field(default_factory=list)
    at_ms: EpochMs

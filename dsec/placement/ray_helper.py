"""A recommendation turned into Ray scheduling, for trainers that run their workers on Ray
(veRL, OpenRLHF, SkyRL): a node-affinity strategy for one actor, or placement-group
bundles pinned to the recommended GPUs.

How Ray nodes are named to dsec: each raylet is started with the custom resource
``dsec_node_<node id>`` (or the label ``dsec.io/node``) and one ``dsec_gpu_<GPU UUID>``
resource per GPU, e.g. ``ray start --resources='{"dsec_node_n1": 1, "dsec_gpu_GPU-a": 1}'``.
Ray is imported only when a helper is called.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dsec.schemas.placement import Recommendation

__all__ = ["GPU_RESOURCE_PREFIX", "NODE_LABEL", "NODE_RESOURCE_PREFIX", "NoRayNode",
           "gpu_resource", "node_affinity", "placement_bundles", "ray_node_id"]

NODE_RESOURCE_PREFIX = "dsec_node_"
GPU_RESOURCE_PREFIX = "dsec_gpu_"
NODE_LABEL = "dsec.io/node"
INSTALL_HINT = "Ray is missing: pip install 'ray[default]>=2.9'"


class NoRayNode(LookupError):
    """No live Ray node stands for ``node_id``."""

    def __init__(self, node_id: str) -> None:
        super().__init__(f"no live Ray node carries {NODE_RESOURCE_PREFIX}{node_id} or the "
                         f"label {NODE_LABEL}={node_id}")
        self.node_id = node_id


def gpu_resource(gpu_uuid: str) -> str:
    return f"{GPU_RESOURCE_PREFIX}{gpu_uuid}"


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return ray


def ray_node_id(node_id: str, nodes: Iterable[dict] | None = None) -> str:
    """The Ray NodeID (hex) of the live node standing for dsec's ``node_id``; ``nodes``:
    ``ray.nodes()`` (read when None)."""
    for node in nodes if nodes is not None else _ray().nodes():
        if not node.get("Alive", False):
            continue
        if (f"{NODE_RESOURCE_PREFIX}{node_id}" in (node.get("Resources") or {})
                or (node.get("Labels") or {}).get(NODE_LABEL) == node_id):
            return node["NodeID"]
    raise NoRayNode(node_id)


def _node_of(answer: Recommendation, gpu_uuid: str) -> str:
    return next(gpu.node_id for gpu in answer.ranked if gpu.gpu_uuid == gpu_uuid)


def node_affinity(answer: Recommendation, soft: bool = False,
                  nodes: Iterable[dict] | None = None) -> Any:
    """A ``NodeAffinitySchedulingStrategy`` to the node of the first chosen GPU; ``soft``:
    Ray may place elsewhere when that node cannot take the task."""
    if not answer.chosen:
        raise ValueError(f"nothing chosen for {answer.workload}: {answer.chosen_reasons}")
    _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    target = ray_node_id(_node_of(answer, answer.chosen[0]), nodes)
    return NodeAffinitySchedulingStrategy(node_id=target, soft=soft)


def placement_bundles(answer: Recommendation, per_bundle: dict[str, float] | None = None,
                      ) -> list[dict[str, float]]:
    """One bundle per chosen GPU, holding that GPU's own resource (so Ray puts the bundle
    on the node that has it) beside ``per_bundle`` (CPUs, memory); pass them to
    ``ray.util.placement_group(bundles, strategy="PACK")``."""
    if not answer.chosen:
        raise ValueError(f"nothing chosen for {answer.workload}: {answer.chosen_reasons}")
    return [{**(per_bundle or {}), gpu_resource(uuid): 1.0} for uuid in answer.chosen]

"""A kube-scheduler extender: the ``filter`` and ``prioritize`` verbs over the JSON types
of ``k8s.io/kube-scheduler/extender/v1`` (``ExtenderArgs`` in; ``ExtenderFilterResult``
and ``HostPriorityList`` out), answered from a recommendation.

The pod says what it is with labels (annotations win): ``dsec.io/workload`` (else its
namespace), ``dsec.io/pool``, ``dsec.io/regime``. A node whose GPUs dsec knows and all of
which are filtered (degraded, held after degradation, another pool) fails the filter with
the reasons; a node dsec knows nothing of passes, so dsec never blocks what it cannot
judge. A node's priority is its best usable GPU's score on kube-scheduler's 0..10 scale.
"""

from __future__ import annotations

from typing import Any

from dsec.schemas.placement import Recommendation, RecommendRequest

__all__ = ["MAX_EXTENDER_PRIORITY", "filter_nodes", "pod_request", "prioritize_nodes"]

# framework.MaxExtenderPriority: an extender's scores are 0..10, scaled by its weight.
MAX_EXTENDER_PRIORITY = 10
WORKLOAD_KEY, POOL_KEY, REGIME_KEY = "dsec.io/workload", "dsec.io/pool", "dsec.io/regime"
REGIMES = ("short", "medium", "long", "all")


def pod_request(args: dict[str, Any]) -> RecommendRequest:
    """What the pod in ``ExtenderArgs`` asks dsec for."""
    metadata = (args.get("pod") or {}).get("metadata") or {}
    said = {**(metadata.get("labels") or {}), **(metadata.get("annotations") or {})}
    regime = said.get(REGIME_KEY, "all")
    return RecommendRequest(
        workload=said.get(WORKLOAD_KEY) or metadata.get("namespace") or "default",
        pool=said.get(POOL_KEY) or None, regime=regime if regime in REGIMES else "all")


def _node_names(args: dict[str, Any]) -> list[str]:
    if args.get("nodes") is not None:
        return [(item.get("metadata") or {}).get("name", "")
                for item in args["nodes"].get("items") or []]
    return list(args.get("nodenames") or [])


def filter_nodes(args: dict[str, Any], answer: Recommendation) -> dict[str, Any]:
    """An ``ExtenderFilterResult``: in the form the nodes came in (``nodes`` for a
    scheduler that is not node-cache capable, else ``nodenames``)."""
    usable = {gpu.node_id for gpu in answer.ranked}
    why: dict[str, list[str]] = {}
    for gpu in answer.filtered:
        why.setdefault(gpu.node_id, []).append(f"{gpu.gpu_uuid}: {gpu.why}")
    failed = {node: "dsec: no usable GPU: " + "; ".join(reasons)
              for node, reasons in why.items() if node not in usable}
    # Empty fields left out, as Go's ``omitempty`` leaves them out.
    result: dict[str, Any] = {}
    names = _node_names(args)
    failed_here = {name: failed[name] for name in names if name in failed}
    if failed_here:
        result["failedNodes"] = failed_here
    if args.get("nodes") is not None:
        nodes = args["nodes"]
        result["nodes"] = {**nodes, "items": [
            item for item in nodes.get("items") or []
            if (item.get("metadata") or {}).get("name") not in failed]}
    else:
        result["nodenames"] = [name for name in names if name not in failed]
    return result


def prioritize_nodes(args: dict[str, Any], answer: Recommendation,
                     unknown_score: float) -> list[dict[str, Any]]:
    """A ``HostPriorityList``, one entry per node asked about."""
    best: dict[str, float] = {}
    for gpu in answer.ranked:
        best[gpu.node_id] = max(best.get(gpu.node_id, 0.0), gpu.score)
    known_but_unusable = {gpu.node_id for gpu in answer.filtered} - set(best)
    out = []
    for name in _node_names(args):
        score = 0.0 if name in known_but_unusable else best.get(name, unknown_score)
        out.append({"host": name,
                    "score": round(min(max(score, 0.0), 1.0) * MAX_EXTENDER_PRIORITY)})
    return out

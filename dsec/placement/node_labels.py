"""Kubernetes node labels and taints kept in step with GPU health, with the official
``kubernetes`` Python client (``CoreV1Api``: ``list_node``, ``patch_node``).

On each node dsec knows GPUs of: ``dsec.io/gpus-unusable`` (how many of its GPUs are
degraded or held after degradation) and ``dsec.io/gpu-degraded`` ("true" when any is);
and, when none of its GPUs is usable, the taint ``dsec.io/gpu-degraded:NoSchedule``, taken
off again once one is. Nodes dsec knows nothing of are left alone, and so is every label
and taint that is not dsec's.
"""

from __future__ import annotations

from typing import Any

from dsec.placement.history import Query, read_history
from dsec.placement.ranking import PlacementConfig, recommend
from dsec.schemas import now_ms
from dsec.schemas.placement import RecommendRequest

__all__ = ["DEGRADED_LABEL", "TAINT_KEY", "UNUSABLE_LABEL", "NodeLabeller",
           "kubernetes_core_api"]

DEGRADED_LABEL = "dsec.io/gpu-degraded"
UNUSABLE_LABEL = "dsec.io/gpus-unusable"
TAINT_KEY = "dsec.io/gpu-degraded"
TAINT_EFFECT = "NoSchedule"
INSTALL_HINT = "the Kubernetes client is missing: pip install 'kubernetes>=31'"


def kubernetes_core_api() -> Any:
    """A ``CoreV1Api`` from the in-cluster service account, else the kubeconfig."""
    try:
        from kubernetes import client, config
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api()


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


class NodeLabeller:
    def __init__(self, api: Any, query: Query, hold_s: float = 600.0) -> None:
        """``api``: a ``kubernetes.client.CoreV1Api`` (or anything with its ``list_node``
        and ``patch_node``)."""
        self._api = api
        self._query = query
        self._config = PlacementConfig(hold_s=hold_s)

    def desired(self) -> dict[str, tuple[int, int]]:
        """node -> (its GPUs dsec knows, those unusable now)."""
        answer = recommend(read_history(self._query), RecommendRequest(workload="node-labels"),
                           now_ms(), self._config)
        nodes: dict[str, list[int]] = {}
        for gpu in answer.ranked:
            nodes.setdefault(gpu.node_id, [0, 0])[0] += 1
        for gpu in answer.filtered:
            if gpu.why.startswith("in pool"):
                continue
            counts = nodes.setdefault(gpu.node_id, [0, 0])
            counts[0] += 1
            counts[1] += 1
        return {node: (known, unusable) for node, (known, unusable) in nodes.items() if node}

    def sync(self) -> list[str]:
        """Patches every node whose dsec labels or taint are not as they should be; returns
        the names of those patched."""
        wanted = self.desired()
        patched = []
        for node in _field(self._api.list_node(), "items") or []:
            metadata, spec = _field(node, "metadata"), _field(node, "spec")
            name = _field(metadata, "name")
            if name not in wanted:
                continue
            known, unusable = wanted[name]
            labels = dict(_field(metadata, "labels") or {})
            want_labels = {UNUSABLE_LABEL: str(unusable),
                           DEGRADED_LABEL: "true" if unusable else "false"}
            taints = [_taint_dict(t) for t in (_field(spec, "taints") or [])] if spec else []
            others = [t for t in taints if t["key"] != TAINT_KEY]
            want_taints = others + ([{"key": TAINT_KEY, "value": "true", "effect": TAINT_EFFECT}]
                                    if unusable == known else [])
            body: dict[str, Any] = {}
            if any(labels.get(k) != v for k, v in want_labels.items()):
                body["metadata"] = {"labels": want_labels}
            if taints != want_taints:
                # Node taints have no merge key: the list is replaced whole, others' kept.
                body["spec"] = {"taints": want_taints}
            if body:
                self._api.patch_node(name, body)
                patched.append(name)
        return patched


def _taint_dict(taint: Any) -> dict[str, Any]:
    out = {"key": _field(taint, "key"), "effect": _field(taint, "effect")}
    value = _field(taint, "value")
    if value is not None:
        out["value"] = value
    return out

"""Node labels and taints from GPU health. The ``kubernetes`` client is not installed here
and no API server runs, so ``FakeCoreV1Api`` stands in for ``CoreV1Api``: it keeps
nodes shaped as the client's models are (``items``, ``metadata.labels``, ``spec.taints``)
and applies ``patch_node`` bodies as the API server applies a merge patch to a node."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dsec.placement.node_labels import (
    DEGRADED_LABEL,
    TAINT_KEY,
    UNUSABLE_LABEL,
    NodeLabeller,
    kubernetes_core_api,
)
from dsec.schemas import now_ms


class FakeCoreV1Api:
    def __init__(self, names: list[str]) -> None:
        self.nodes = {name: SimpleNamespace(
            metadata=SimpleNamespace(name=name, labels={"kubernetes.io/hostname": name}),
            spec=SimpleNamespace(taints=[SimpleNamespace(key="other", value=None,
                                                         effect="NoExecute")]))
            for name in names}
        self.patches: list[tuple[str, dict]] = []

    def list_node(self):
        return SimpleNamespace(items=list(self.nodes.values()))

    def patch_node(self, name: str, body: dict):
        self.patches.append((name, body))
        node = self.nodes[name]
        node.metadata.labels.update(body.get("metadata", {}).get("labels", {}))
        if "spec" in body:
            node.spec.taints = [SimpleNamespace(value=None, **t) if "value" not in t
                                else SimpleNamespace(**t) for t in body["spec"]["taints"]]
        return node


def _history_query(health: dict[str, tuple[str, int]]):
    gpus = [("gpu", uuid, "X", node, "", "all")
            for uuid, node in (("GPU-a0", "node-a"), ("GPU-a1", "node-a"), ("GPU-b0", "node-b"))]

    def query(sql: str) -> dict:
        if "gpu_personalities" in sql:
            return {"rows": [[*g, 0.5, 0.9, 0, 0, 0, 0, 0, 0, 3600, 1, 1] for g in gpus]}
        if "gpu_health" in sql:
            return {"rows": [[u, state, since, "thermal_throttle", "hot"]
                             for u, (state, since) in health.items()]}
        return {"rows": []}
    return query


def test_labels_and_taint_follow_gpu_health() -> None:
    api = FakeCoreV1Api(["node-a", "node-b", "node-other"])
    health = {"GPU-b0": ("degraded", now_ms() - 1000), "GPU-a0": ("degraded", now_ms())}
    labeller = NodeLabeller(api, _history_query(health), hold_s=60)
    assert labeller.sync() == ["node-a", "node-b"]
    a, b = api.nodes["node-a"], api.nodes["node-b"]
    assert a.metadata.labels[UNUSABLE_LABEL] == "1" and a.metadata.labels[DEGRADED_LABEL] == "true"
    assert [t.key for t in a.spec.taints] == ["other"]  # one usable GPU left: no taint
    assert b.metadata.labels[UNUSABLE_LABEL] == "1"
    assert [t.key for t in b.spec.taints] == ["other", TAINT_KEY]
    assert "node-other" not in [name for name, _ in api.patches]
    assert labeller.sync() == []  # in step: nothing patched again
    health["GPU-b0"] = ("healthy", now_ms() - 120_000)  # healthy for longer than the hold
    assert labeller.sync() == ["node-b"]
    assert b.metadata.labels[DEGRADED_LABEL] == "false"
    assert [t.key for t in b.spec.taints] == ["other"]


def test_without_the_client_the_error_says_what_to_install() -> None:
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install 'kubernetes"):
            kubernetes_core_api()
    else:
        pytest.skip("the kubernetes client is installed here")

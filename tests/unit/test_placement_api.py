"""The recommendation API and the kube-scheduler extender over HTTP, with payloads shaped
as kube-scheduler sends them (k8s.io/kube-scheduler/extender/v1)."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from dsec.placement.api import HistorySource, make_app, store_history
from dsec.placement.history import GpuHealth, GpuRecord, PlacementHistory
from dsec.placement.ranking import PlacementConfig

NOW_MS = 1_700_000_000_000


def _stats(score: float) -> dict[str, float]:
    return {"stability_score": score, "leak_bytes_per_s": 0.0, "leak_observed_s": 0.0,
            "bandwidth_jitter": 0.0, "throttle_events": 0.0, "ooms": 0.0,
            "interruptions": 0.0, "observed_s": 3600.0, "workers": 1.0, "feature_events": 1.0}


def _history() -> PlacementHistory:
    history = PlacementHistory(gpus={
        "GPU-hot": GpuRecord("GPU-hot", "X", "node-hot", "", 0.9, {"all": _stats(0.9)}),
        "GPU-stable": GpuRecord("GPU-stable", "X", "node-stable", "", 0.9,
                                {"long": _stats(0.95), "all": _stats(0.95)}),
        "GPU-leaky": GpuRecord("GPU-leaky", "X", "node-leaky", "", 0.9,
                               {"long": _stats(0.2), "all": _stats(0.6)}),
    })
    history.health["GPU-hot"] = GpuHealth("degraded", NOW_MS - 1000, "thermal_throttle",
                                          "throttled 12 of 20 samples")
    return history


@pytest.fixture
def client() -> TestClient:
    source = HistorySource(_history, refresh_s=0)
    return TestClient(make_app(source, PlacementConfig(hold_s=60), clock_ms=lambda: NOW_MS))


def _node(name: str) -> dict:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                         "labels": {"kubernetes.io/hostname": name}},
            "spec": {}, "status": {"capacity": {"nvidia.com/gpu": "8"},
                                   "allocatable": {"nvidia.com/gpu": "8"}}}


POD = {"metadata": {"name": "learner-0", "namespace": "rl",
                    "labels": {"dsec.io/workload": "ppo", "dsec.io/regime": "long"}},
       "spec": {"containers": [{"name": "learner", "image": "trainer:1",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
       "status": {"phase": "Pending"}}
NODES = ["node-hot", "node-stable", "node-leaky", "node-unknown"]


def test_filter_drops_the_degraded_node_with_why_in_either_form(client: TestClient) -> None:
    node_list = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"},
                 "items": [_node(n) for n in NODES]}
    answer = client.post("/scheduler/filter", json={"pod": POD, "nodes": node_list}).json()
    assert [n["metadata"]["name"] for n in answer["nodes"]["items"]] == NODES[1:]
    assert answer["nodes"]["kind"] == "NodeList"
    assert set(answer["failedNodes"]) == {"node-hot"}
    assert "degraded" in answer["failedNodes"]["node-hot"]
    assert set(answer) == {"nodes", "failedNodes"}
    cached = client.post("/scheduler/filter", json={"pod": POD, "nodenames": NODES}).json()
    assert cached["nodenames"] == NODES[1:] and "nodes" not in cached


def test_prioritize_scores_the_stable_node_higher(client: TestClient) -> None:
    answer = client.post("/scheduler/prioritize", json={"pod": POD, "nodenames": NODES}).json()
    scores = {entry["host"]: entry["score"] for entry in answer}
    assert set(answer[0]) == {"host", "score"}
    assert scores == {"node-hot": 0, "node-stable": 10, "node-leaky": 2, "node-unknown": 5}


def test_recommend_by_post_and_get_and_the_openapi_document(client: TestClient) -> None:
    posted = client.post("/v1/recommend", json={"workload": "ppo", "regime": "long"}).json()
    assert posted["chosen"] == ["GPU-stable"]
    assert posted["filtered"][0]["gpu_uuid"] == "GPU-hot"
    assert posted["ranked"][0]["reasons"][0]["key"] == "gpu:GPU-stable/long"
    got = client.get("/v1/recommend", params={"workload": "ppo", "count": 2}).json()
    assert got["chosen"] == ["GPU-stable", "GPU-leaky"]
    bad = client.post("/v1/recommend", json={"count": 0})
    assert bad.status_code == 400
    document = client.get("/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert {"RecommendRequest", "Recommendation"} <= set(document["components"]["schemas"])
    assert client.post("/scheduler/bind", json={}).status_code == 404


def test_an_unreadable_store_answers_503() -> None:
    def broken(_sql: str) -> dict:
        raise ConnectionError("store down")

    app = TestClient(make_app(HistorySource(store_history(broken))))
    answer = app.get("/v1/recommend", params={"workload": "w"})
    assert answer.status_code == 503 and "store down" in answer.json()["error"]

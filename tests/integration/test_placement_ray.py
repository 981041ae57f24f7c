"""The Ray helper on a real local multi-node Ray cluster (three raylets on this machine,
custom resources standing for nodes and GPUs): an actor placed through the helper lands
on the recommended node, and placement-group bundles on the recommended GPUs' nodes."""

from __future__ import annotations

import pytest

from dsec.placement.history import GpuRecord, PlacementHistory
from dsec.placement.ranking import recommend
from dsec.placement.ray_helper import (
    NoRayNode,
    gpu_resource,
    node_affinity,
    placement_bundles,
    ray_node_id,
)
from dsec.schemas import now_ms
from dsec.schemas.placement import RecommendRequest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402
from ray.util.scheduling_strategies import (  # noqa: E402
    PlacementGroupSchedulingStrategy,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
GPUS = {"n1": ["GPU-a", "GPU-b"], "n2": ["GPU-c", "GPU-d"]}


def _stats(score: float) -> dict[str, float]:
    return {"stability_score": score, "leak_bytes_per_s": 0.0, "leak_observed_s": 0.0,
            "bandwidth_jitter": 0.0, "throttle_events": 0.0, "ooms": 0.0,
            "interruptions": 0.0, "observed_s": 3600.0, "workers": 1.0, "feature_events": 1.0}


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "object_store_memory": 75 << 20})
    for node, gpus in GPUS.items():
        cluster.add_node(num_cpus=2, object_store_memory=75 << 20, resources={
            f"dsec_node_{node}": 1, **{gpu_resource(g): 1 for g in gpus}})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@ray.remote(num_cpus=0.5)
class Where:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=0.5)
def where() -> str:
    return ray.get_runtime_context().get_node_id()


def test_an_actor_placed_through_the_helper_lands_on_the_recommended_node(cluster) -> None:
    # n2's cards are the stable ones: the recommendation sends the worker there.
    history = PlacementHistory(gpus={
        uuid: GpuRecord(uuid, "X", node, "", 0.9, {"all": _stats(0.9 if node == "n2" else 0.3)})
        for node, gpus in GPUS.items() for uuid in gpus})
    answer = recommend(history, RecommendRequest(workload="learner"), now_ms())
    assert answer.chosen == ["GPU-c"]
    actor = Where.options(scheduling_strategy=node_affinity(answer)).remote()
    assert ray.get(actor.node.remote(), timeout=180) == ray_node_id("n2")
    ray.kill(actor)

    pair = recommend(history, RecommendRequest(workload="learner", count=2), now_ms())
    bundles = placement_bundles(pair, {"CPU": 0.5})
    assert bundles == [{"CPU": 0.5, "dsec_gpu_GPU-c": 1.0}, {"CPU": 0.5, "dsec_gpu_GPU-d": 1.0}]
    group = placement_group(bundles, strategy="PACK")
    ray.get(group.ready(), timeout=180)
    landed = ray.get([where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        group, placement_group_bundle_index=i)).remote() for i in range(2)], timeout=180)
    assert landed == [ray_node_id("n2")] * 2
    remove_placement_group(group)
    with pytest.raises(NoRayNode):
        ray_node_id("n9")

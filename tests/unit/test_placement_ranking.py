"""The recommendation as a pure function of the history: personalities, workload
affinity, the degraded-GPU hold, and topology for communicating groups."""

from __future__ import annotations

from dsec.placement.history import (
    GpuHealth,
    GpuRecord,
    ModelAffinity,
    PlacementHistory,
    Topology,
)
from dsec.placement.ranking import PlacementConfig, recommend
from dsec.schemas.placement import RecommendRequest

NOW_MS = 1_700_000_000_000


def stats(score: float, **values: float) -> dict[str, float]:
    base = {"stability_score": score, "leak_bytes_per_s": 0.0, "leak_observed_s": 0.0,
            "bandwidth_jitter": 0.0, "throttle_events": 0.0, "ooms": 0.0,
            "interruptions": 0.0, "observed_s": 3600.0, "workers": 1.0,
            "feature_events": 10.0}
    return {**base, **values}


def gpu(uuid: str, model: str, node: str = "n1", **regimes: dict) -> GpuRecord:
    return GpuRecord(uuid, model, node, "p", 0.9, regimes)


def test_the_stable_card_ranks_first_for_long_episodes_with_its_reasons() -> None:
    history = PlacementHistory(gpus={
        "GPU-leaky": gpu("GPU-leaky", "X", long=stats(0.2, leak_bytes_per_s=4e6),
                         short=stats(1.0)),
        "GPU-stable": gpu("GPU-stable", "X", long=stats(0.95), short=stats(0.95)),
    })
    long = recommend(history, RecommendRequest(workload="w", regime="long"), NOW_MS)
    assert [r.gpu_uuid for r in long.ranked] == ["GPU-stable", "GPU-leaky"]
    assert long.chosen == ["GPU-stable"]
    leaky = long.ranked[1]
    assert leaky.reasons[0].key == "gpu:GPU-leaky/long" and "leak 4000000 B/s" in \
        leaky.reasons[0].detail
    short = recommend(history, RecommendRequest(workload="w", regime="short"), NOW_MS)
    assert short.ranked[0].gpu_uuid == "GPU-leaky"


def test_a_workload_that_oomed_on_one_model_goes_to_the_model_it_ran_stable_on() -> None:
    history = PlacementHistory(
        gpus={"GPU-x": gpu("GPU-x", "X", all=stats(0.9)),
              "GPU-y": gpu("GPU-y", "Y", all=stats(0.9))},
        affinity={("ppo", "X"): ModelAffinity(ooms=2, stable_s=600.0, observed_s=900.0),
                  ("ppo", "Y"): ModelAffinity(stable_s=7200.0, observed_s=7200.0)})
    answer = recommend(history, RecommendRequest(workload="ppo"), NOW_MS)
    assert answer.chosen == ["GPU-y"]
    x = next(r for r in answer.ranked if r.gpu_uuid == "GPU-x")
    assert any(r.source == "workload_affinity" and "2 OOMs" in r.detail for r in x.reasons)
    other = recommend(history, RecommendRequest(workload="other"), NOW_MS)
    assert other.ranked[0].score == other.ranked[1].score


def test_a_degraded_gpu_is_filtered_until_healthy_for_the_hold_time() -> None:
    config = PlacementConfig(hold_s=60.0)
    history = PlacementHistory(gpus={"GPU-a": gpu("GPU-a", "X", all=stats(0.9)),
                                     "GPU-b": gpu("GPU-b", "X", all=stats(0.5))})
    history.health["GPU-a"] = GpuHealth("degraded", NOW_MS - 5_000, "thermal_throttle", "hot")
    answer = recommend(history, RecommendRequest(workload="w"), NOW_MS, config)
    assert answer.chosen == ["GPU-b"]
    assert "degraded" in answer.filtered[0].why and "thermal_throttle" in answer.filtered[0].why
    history.health["GPU-a"] = GpuHealth("healthy", NOW_MS - 30_000, "thermal_throttle")
    held = recommend(history, RecommendRequest(workload="w"), NOW_MS, config)
    assert held.filtered[0].why.startswith("healthy for 30 s of the 60 s hold")
    back = recommend(history, RecommendRequest(workload="w"), NOW_MS + 30_000, config)
    assert back.filtered == [] and back.chosen == ["GPU-a"]


def test_pool_filter_and_an_unknown_gpu() -> None:
    history = PlacementHistory(
        gpus={"GPU-a": GpuRecord("GPU-a", "X", "n1", "other", 0.9, {"all": stats(1.0)})},
        topology={"GPU-new": Topology("n2", "X", 0, (0, 1), {})})
    answer = recommend(history, RecommendRequest(workload="w", pool="p"), NOW_MS)
    assert [f.why for f in answer.filtered] == ["in pool other, not p", "in pool (none), not p"]
    anywhere = recommend(history, RecommendRequest(workload="w"), NOW_MS)
    assert anywhere.chosen == ["GPU-a"] and anywhere.ranked[1].score == 0.5


def test_a_communicating_group_stays_on_one_numa_node_with_nvlink() -> None:
    def topo(node: str, numa: int, links: dict[str, str]) -> Topology:
        return Topology(node, "X", numa, (), links)

    history = PlacementHistory(
        gpus={u: gpu(u, "X", node, all=stats(s)) for u, node, s in (
            ("g0", "n1", 0.9), ("g1", "n1", 0.8), ("g2", "n1", 0.85), ("g3", "n2", 0.95))},
        topology={"g0": topo("n1", 0, {"g1": "nvlink", "g2": "system"}),
                  "g1": topo("n1", 0, {"g0": "nvlink", "g2": "system"}),
                  "g2": topo("n1", 1, {"g0": "system", "g1": "system"}),
                  "g3": topo("n2", 0, {})})
    apart = recommend(history, RecommendRequest(workload="w", count=2), NOW_MS)
    assert apart.chosen == ["g3", "g0"]
    together = recommend(history, RecommendRequest(workload="w", count=2, communicating=True),
                         NOW_MS)
    assert sorted(together.chosen) == ["g0", "g1"]
    assert {r.source for r in together.chosen_reasons} == {"placement", "gpu_topology"}

"""The personality job as a pure stage: OOMs, interruptions, observed and stable time, and
leak rates per regime, from feature events and GPU profiles."""

from __future__ import annotations

from dsec.schemas import FeatureEvent, GpuProfileEvent, WorkerIdentity
from dsec.schemas.features import RegimeGrowth
from dsec.schemas.placement import GpuPersonalityEvent, WorkloadAffinityEvent
from dsec.stream_jobs.personality import (
    PersonalityConfig,
    PersonalityJob,
    regime_of,
    stability_score,
)

T0 = 1_700_000_000_000


def features(worker: str, gpu: str, model: str, t_s: float, **values: float) -> FeatureEvent:
    return FeatureEvent(
        identity=WorkerIdentity(job_id="j", worker_id=worker, node_id="n1", pool="p",
                                labels={"workload": "ppo-long"}),
        gpu_uuid=gpu, event_time_ms=T0 + int(t_s * 1000), tags={"gpu_model": model},
        features={"episode_length_mean": 500.0, **values})


def test_ooms_interruptions_and_stable_time_are_counted_per_gpu_and_model() -> None:
    job = PersonalityJob()
    for t in range(0, 100, 10):
        job.add_features(features("w0", "GPU-a", "A100", t, gpu_oom_total=float(t >= 50)))
        job.add_features(features("w1", "GPU-b", "H100", t, recoveries_total=0.0))
    job.add_features(features("w1", "GPU-b", "H100", 100, worker_lost=1.0))
    changes = job.take_changes(T0 + 100_000)
    gpus = {e.gpu_uuid: e for e in changes
            if isinstance(e, GpuPersonalityEvent) and e.scope == "gpu"}
    assert gpus["GPU-a"].regimes["long"].ooms == 1
    assert gpus["GPU-a"].regimes["long"].observed_s == 90.0
    assert gpus["GPU-b"].regimes["all"].interruptions == 1
    assert gpus["GPU-a"].stability_score["long"] < 1.0
    affinity = {(e.workload, e.gpu_model): e for e in changes
                if isinstance(e, WorkloadAffinityEvent)}
    assert affinity[("ppo-long", "A100")].ooms == 1
    assert affinity[("ppo-long", "A100")].stable_s == 80.0  # the 10 s with the OOM left out
    assert affinity[("ppo-long", "H100")].stable_s == 90.0
    assert job.take_changes(T0 + 200_000) == []  # nothing changed since


def test_leak_rate_per_regime_comes_from_the_gpu_profiles() -> None:
    job = PersonalityJob()
    job.add_profile(GpuProfileEvent(
        gpu_uuid="GPU-a", gpu_model="A100", event_time_ms=T0,
        identity=WorkerIdentity(job_id="j", worker_id="w0", node_id="n1"),
        regimes={"long": RegimeGrowth(delta_bytes=8 << 20, delta_s=4.0),
                 "short": RegimeGrowth(delta_bytes=0.0, delta_s=4.0)}))
    (gpu, model) = job.take_changes(T0)
    assert gpu.regimes["long"].leak_bytes_per_s == 2 << 20
    assert gpu.regimes["short"].leak_bytes_per_s == 0.0
    assert gpu.stability_score["long"] < gpu.stability_score["short"] == 1.0
    assert model.scope == "model" and model.regimes["long"].leak_bytes_per_s == 2 << 20


def test_a_restarted_process_counts_its_ooms_from_zero() -> None:
    job = PersonalityJob()
    job.add_features(features("w0", "GPU-a", "A100", 0, gpu_oom_total=3.0))  # baseline
    job.add_features(features("w0", "GPU-a", "A100", 5, gpu_oom_total=4.0))
    job.add_features(features("w0", "GPU-a", "A100", 10, gpu_oom_total=1.0))
    (gpu, *_rest) = job.take_changes(T0)
    assert gpu.regimes["all"].ooms == 2


def test_restore_goes_on_from_the_published_counters() -> None:
    job = PersonalityJob()
    for t in (0, 10, 20):
        job.add_features(features("w0", "GPU-a", "A100", t, gpu_oom_total=float(t)))
    published = job.take_changes(T0)
    again = PersonalityJob()
    again.restore(published)
    again.add_features(features("w9", "GPU-a", "A100", 30))
    again.add_features(features("w9", "GPU-a", "A100", 40, gpu_oom_total=1.0))
    (gpu, *_rest) = again.take_changes(T0)
    assert gpu.regimes["all"].ooms == 21


def test_scores_and_regimes() -> None:
    config = PersonalityConfig()
    assert regime_of(50, config) == "short" and regime_of(500, config) == "long"
    assert regime_of(None, config) == "all"
    from dsec.schemas.placement import RegimeStats
    clean = RegimeStats(observed_s=7200.0)
    assert stability_score(clean, config) == 1.0
    assert stability_score(RegimeStats(observed_s=7200.0, ooms=1), config) == 0.5


def test_the_history_from_the_events_ranks_as_the_store_would() -> None:
    from dsec.placement.history import history_from_events
    from dsec.placement.ranking import recommend
    from dsec.schemas.placement import RecommendRequest

    job = PersonalityJob()
    for t in range(0, 100, 10):
        job.add_features(features("w0", "GPU-a", "A100", t, gpu_oom_total=float(t // 30)))
        job.add_features(features("w1", "GPU-b", "H100", t))
    history = history_from_events(job.take_changes(T0 + 100_000))
    assert history.gpus["GPU-a"].regimes["long"]["ooms"] == 3
    assert history.affinity[("ppo-long", "A100")].ooms == 3
    answer = recommend(history, RecommendRequest(workload="ppo-long", regime="long"), T0)
    assert answer.chosen == ["GPU-b"]

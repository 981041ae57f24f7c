"""Placement in the experiment: where a restarter puts a worker that died of an OOM.

A fleet of simulated cards (``SimulatedGpu``, its memory enforced) of two models, one of
which fragments memory on long episodes (the scenario's leaky model); workers with a
long-episode workload; a restarter that brings a dead worker back after a delay. Without
placement the worker comes back on its own card, as the goodput runner's restarter does;
with placement the restarter asks the recommendation API (``dsec placement serve``'s app,
over HTTP on a loopback port) and takes the best-ranked free card. The API's history is
what this run's workers reported: their feature events through the personality job.

Simulated time (one step is ``step_ms``), seeded: both arms see the same episodes and the
same first placement, so the interruptions of the two arms compare on the same seeds.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from dsec.experiment.recommend_api import RecommendationServer
from dsec.experiment.sim_gpu import GIB, GpuSpec, SimulatedGpu, SimulatedOutOfMemoryError
from dsec.placement.api import HistorySource
from dsec.placement.history import history_from_events
from dsec.placement.ranking import PlacementConfig
from dsec.schemas import FeatureEvent, WorkerIdentity
from dsec.schemas.placement import (
    GpuPersonalityEvent,
    GpuTopologyEvent,
    WorkloadAffinityEvent,
)
from dsec.stream_jobs.personality import PersonalityJob

__all__ = ["ArmOutcome", "PlacementScenario", "run_placement_arms"]

MIB = 1 << 20
WORKLOAD = "ppo-long"
T0_MS = 1_800_000_000_000


@dataclass(frozen=True)
class PlacementScenario:
    """One GPU model leaks on long episodes; the workload's episodes are mostly long."""

    name: str = "leaky-model"
    cards: tuple[tuple[str, int], ...] = (("SimGPU-A", 4), ("SimGPU-B", 4))
    leaky_model: str = "SimGPU-A"
    workers: int = 4
    steps: int = 4000
    step_ms: int = 100
    long_episode_share: float = 0.8
    long_episode_steps: int = 150
    short_episode_steps: int = 30
    # Fragmented on every step of a long episode on a leaky card: a 24 GiB card with a
    # 12 GiB working set runs out after ~1,500 such steps.
    leak_bytes_per_step: int = 8 * MIB
    working_set_bytes: int = 12 * GIB
    restart_delay_steps: int = 50
    report_every_steps: int = 10


@dataclass
class ArmOutcome:
    placement: bool
    seed: int
    interruptions: int = 0
    productive_steps: int = 0
    restarts_on_leaky_model: int = 0
    restarts: int = 0
    restart_cards: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"placement": self.placement, "seed": self.seed,
                "interruptions": self.interruptions, "productive_steps": self.productive_steps,
                "restarts": self.restarts,
                "restarts_on_leaky_model": self.restarts_on_leaky_model}


@dataclass
class _Worker:
    name: str
    card: str
    gpu: SimulatedGpu
    episode_left: int = 0
    long_episode: bool = False
    restart_at: int | None = None
    incarnation: int = 0
    ooms: int = 0  # what the dying process's probe reported last


class _Api(RecommendationServer):
    """The API answering at the simulation's time, ``now_ms``, set by the restarter."""

    def __init__(self, load: Callable, config: PlacementConfig) -> None:
        self.now_ms = T0_MS
        super().__init__(HistorySource(load, refresh_s=0.0), config,
                         clock_ms=lambda: self.now_ms)


def _card_models(scenario: PlacementScenario) -> dict[str, str]:
    return {f"GPU-{model}-{i}": model for model, count in scenario.cards for i in range(count)}


def _arm(scenario: PlacementScenario, seed: int, api: _Api | None,
         events: list) -> ArmOutcome:
    models = _card_models(scenario)
    cards = list(models)
    episodes = random.Random(seed)
    outcome = ArmOutcome(placement=api is not None, seed=seed)
    # The first placement is the scheduler's, without history: the same in both arms.
    first = random.Random(seed * 7919 + 1).sample(cards, scenario.workers)
    workers = [_Worker(f"w{i}", card, SimulatedGpu(card, GpuSpec(name=models[card])))
               for i, card in enumerate(first)]
    job = PersonalityJob()

    def report(worker: _Worker, step: int, **values: float) -> None:
        job.add_features(FeatureEvent(
            identity=WorkerIdentity(job_id="placement-experiment",
                                    worker_id=f"{worker.name}-{worker.incarnation}",
                                    node_id=f"node-{worker.card}",
                                    labels={"workload": WORKLOAD}),
            gpu_uuid=worker.card, event_time_ms=T0_MS + step * scenario.step_ms,
            tags={"gpu_model": models[worker.card]},
            features={"episode_length_mean": float(scenario.long_episode_steps),
                      "gpu_oom_total": float(worker.ooms), **values}))

    def restart_card(worker: _Worker, step: int) -> str:
        if api is None:
            return worker.card
        events.extend(job.take_changes(T0_MS + step * scenario.step_ms))
        api.now_ms = T0_MS + step * scenario.step_ms
        ranked = api.recommend({"workload": WORKLOAD, "regime": "long"})["ranked"]
        busy = {w.card for w in workers if w is not worker and w.restart_at is None}
        return next((g["gpu_uuid"] for g in ranked
                     if g["gpu_uuid"] not in busy), worker.card)

    for step in range(scenario.steps):
        for worker in workers:
            if worker.restart_at is not None:
                if step < worker.restart_at:
                    continue
                worker.card = restart_card(worker, step)
                worker.gpu = SimulatedGpu(worker.card, GpuSpec(name=models[worker.card]))
                worker.restart_at, worker.ooms, worker.episode_left = None, 0, 0
                worker.incarnation += 1
                outcome.restarts += 1
                outcome.restarts_on_leaky_model += models[worker.card] == scenario.leaky_model
                outcome.restart_cards.append(worker.card)
            if worker.episode_left == 0:
                worker.long_episode = episodes.random() < scenario.long_episode_share
                worker.episode_left = (scenario.long_episode_steps if worker.long_episode
                                       else scenario.short_episode_steps)
            try:
                worker.gpu.set_working_set(scenario.working_set_bytes)
                if worker.long_episode and models[worker.card] == scenario.leaky_model:
                    worker.gpu.fragment(scenario.leak_bytes_per_step)
            except SimulatedOutOfMemoryError:
                worker.ooms += 1
                outcome.interruptions += 1
                report(worker, step)  # the probe's last flush, with the OOM counted
                worker.restart_at = step + scenario.restart_delay_steps
                continue
            worker.episode_left -= 1
            outcome.productive_steps += 1
            if step % scenario.report_every_steps == 0:
                report(worker, step)
    return outcome


def run_placement_arms(scenario: PlacementScenario, seeds: list[int],
                       config: PlacementConfig | None = None) -> list[dict]:
    """Per seed, the arm without placement and the arm with it."""
    config = config or PlacementConfig()
    results = []
    for seed in seeds:
        # Every card registered as `dsec placement topology` registers a node's cards.
        events: list[GpuPersonalityEvent | WorkloadAffinityEvent | GpuTopologyEvent] = [
            GpuTopologyEvent(event_time_ms=T0_MS, node_id=f"node-{card}", gpu_uuid=card,
                             gpu_model=model, gpu_index=0)
            for card, model in _card_models(scenario).items()]
        without = _arm(scenario, seed, None, [])
        with _Api(lambda events=events: history_from_events(events), config) as api:
            placed = _arm(scenario, seed, api, events)
        results.append({"seed": seed, "without": without.to_json(), "with": placed.to_json()})
    return results

"""The workload shapes and fault classes of the detection bench, and which of them tuned
the built-in pack (the rest are held out: the figures reported are theirs).

A shape is what differs between RL workloads and what detection must not depend on: how
long episodes last and how they usually end, how many workers share a card and how many
cards a node has, the step rate, the noise, and which processes sample NVML.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "CLASS_POLICY", "FAULT_CLASSES", "HELD_OUT_SEEDS", "HELD_OUT_SHAPES", "SHAPES",
    "TUNING_SEEDS", "TUNING_SHAPES", "WorkloadShape",
]

GIB = 1 << 30


@dataclass(frozen=True)
class WorkloadShape:
    name: str
    episode_s_median: float
    episode_s_sigma: float  # of the log of the episode's length: lognormal
    endings: dict[str, float]  # how healthy episodes end: reason -> weight
    workers_per_card: int
    cards_per_node: int
    steps_per_s: float
    noise: float  # relative spread of losses, norms, returns; log-spread of sync latency
    nvml_on_every_worker: bool  # else one process per card samples it (local rank 0)
    own_memory_bytes: int = int(6.5 * GIB)
    reward_mean: float = 100.0
    reward_std: float = 10.0
    sync_latency_ms_median: float = 25.0
    sync_bytes: int = 8 << 20
    notes: str = field(default="", compare=False)


SHAPES: dict[str, WorkloadShape] = {shape.name: shape for shape in (
    # tuning
    WorkloadShape("atari", 4.0, 0.5, {"life_lost": 0.6, "game_over": 0.3, "time_limit": 0.1},
                  workers_per_card=2, cards_per_node=4, steps_per_s=8.0, noise=0.2,
                  nvml_on_every_worker=False, notes="short episodes, ended by the game"),
    WorkloadShape("mujoco", 10.0, 0.1, {"time_limit": 0.85, "fell": 0.15},
                  workers_per_card=1, cards_per_node=8, steps_per_s=4.0, noise=0.15,
                  nvml_on_every_worker=True, notes="fixed-length episodes, a card each"),
    # held out
    WorkloadShape("robotics", 25.0, 0.4,
                  {"time_limit": 0.55, "truncated": 0.3, "success": 0.13,
                   "dropped_object": 0.02},
                  workers_per_card=2, cards_per_node=2, steps_per_s=3.0, noise=0.3,
                  nvml_on_every_worker=False, notes="slow episodes, mostly time limits"),
    WorkloadShape("rlhf", 6.0, 0.6, {"eos": 0.8, "max_length": 0.2},
                  workers_per_card=4, cards_per_node=4, steps_per_s=1.5, noise=0.25,
                  nvml_on_every_worker=False, own_memory_bytes=int(6.0 * GIB),
                  reward_mean=0.5, reward_std=0.2, sync_bytes=32 << 20,
                  notes="four workers a card, rollouts as episodes"),
    WorkloadShape("navigation", 15.0, 0.8,
                  {"timeout": 0.45, "goal": 0.4, "collision": 0.1, "out_of_bounds": 0.05},
                  workers_per_card=2, cards_per_node=8, steps_per_s=5.0, noise=0.35,
                  nvml_on_every_worker=True, reward_mean=-20.0, reward_std=15.0,
                  sync_latency_ms_median=35.0, notes="widely spread episodes and endings"),
)}
TUNING_SHAPES = ("atari", "mujoco")
TUNING_SEEDS = (1, 2)
HELD_OUT_SHAPES = ("robotics", "rlhf", "navigation")
HELD_OUT_SEEDS = (101, 102, 103)

# Each fault class and the built-in policy meant to answer it.
CLASS_POLICY: dict[str, str] = {
    "memory_leak": "elastic-memory-quota",
    "stuck_episode": "stuck-episode",
    "card_degraded": "gpu-degradation-snapshot",
    "nan_burst": "precision-downgrade",
    "variance_jump": "reward-variance-jump",
}
FAULT_CLASSES = tuple(CLASS_POLICY)

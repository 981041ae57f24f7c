"""``--cpu-slowdown K`` and the host's measured update time, for speed-independent runs.

A slower host: every stretch of a worker's CPU work takes K times as long (the thread
sleeps K-1 times the CPU time it just used), as on a host K times slower; the simulated
device's kernels keep their time. The calibration times one update's worth of the
workers' CPU work (a rollout and the PPO epochs, without the simulated kernels) on this
host, at this load, under that slowdown.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# The calibration's update time on the host the scenarios' wall-clock figures were written
# for (one trainer with a core to itself): ``--time-scale auto`` stretches every scenario
# time by the measured time over this one.
REFERENCE_UPDATE_S = 0.25


@dataclass(frozen=True)
class SlowHost:
    factor: float = 1.0

    @contextmanager
    def stretch(self) -> Iterator[None]:
        if self.factor <= 1.0:
            yield
            return
        start = time.thread_time()
        try:
            yield
        finally:
            time.sleep((self.factor - 1.0) * (time.thread_time() - start))


def _one_update(slow_host: SlowHost) -> float:
    import gymnasium as gym
    import numpy as np
    import torch

    from dsec.experiment.ppo import ActorCritic, PpoConfig, build_rollout, ppo_update

    config = PpoConfig()
    model = ActorCritic(4, 2, config.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    envs = [gym.make("CartPole-v1") for _ in range(config.envs)]
    obs = np.stack([env.reset(seed=i)[0] for i, env in enumerate(envs)])
    steps, n = config.rollout_steps, config.envs
    shape = (steps, n)
    b_obs, b_act = np.zeros((*shape, 4), np.float32), np.zeros(shape, np.int64)
    zeros = [np.zeros(shape, np.float32) for _ in range(4)]
    started = time.perf_counter()
    with slow_host.stretch():
        for t in range(steps):
            with torch.no_grad():
                logits, _ = model(torch.as_tensor(obs))
                actions = torch.distributions.Categorical(logits=logits).sample()
            b_obs[t], b_act[t] = obs, actions
            for i, env in enumerate(envs):
                next_obs, _, terminated, truncated, _ = env.step(int(actions[i]))
                obs[i] = env.reset()[0] if terminated or truncated else next_obs
        rollout = build_rollout(b_obs, b_act, *zeros, np.zeros(n, np.float32), config)
        ppo_update(model, optimizer, rollout, config, torch.Generator().manual_seed(0))
    return time.perf_counter() - started


def calibrate_update_s(slow_host: SlowHost, repeats: int = 3) -> float:
    """The median wall time of one update's CPU work here, now."""
    _one_update(slow_host)  # the first pays for lazy imports
    return statistics.median(_one_update(slow_host) for _ in range(repeats))

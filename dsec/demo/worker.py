"""One demo training worker: REINFORCE on gymnasium CartPole, torch on CPU, with dsec.

A reward fault can be injected: from a given moment the environment's reward is
scaled by a random factor per step (a broken reward function), which the worker
trains on, as a sick worker would. The policy runs under ``dsec.autocast()`` and the
update steps through its GradScaler, so a precision command is carried out; a snapshot
command saves the policy. A lone worker has no gradient sync to compress or weigh: such
commands are answered unsupported.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import dsec


class RewardFault(gym.RewardWrapper):
    def __init__(self, env: gym.Env, start_s: float | None, seed: int) -> None:
        super().__init__(env)
        self._start = None if start_s is None else time.monotonic() + start_s
        self._rng = random.Random(seed)

    @property
    def active(self) -> bool:
        return self._start is not None and time.monotonic() >= self._start

    def reward(self, reward: float) -> float:
        return reward * self._rng.uniform(0.0, 8.0) if self.active else reward


def discounted_returns(rewards: list[float], gamma: float) -> torch.Tensor:
    returns, running = [], 0.0
    for reward in reversed(rewards):
        running = reward + gamma * running
        returns.append(running)
    out = torch.tensor(returns[::-1], dtype=torch.float32)
    return (out - out.mean()) / (out.std() + 1e-8) if len(out) > 1 else out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsec.demo.worker")
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reward-fault-at-s", type=float, default=None)
    parser.add_argument("--snapshot-dir", type=Path, required=True)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    env = RewardFault(gym.make("CartPole-v1"), args.reward_fault_at_s, args.seed)
    policy = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    dsec.init(worker_id=args.worker_id, node_id=args.node_id, optimizer=optimizer)

    episodes = 0
    snapshots: list[str] = []

    @dsec.on_action("snapshot")
    def take_snapshot(_params: object) -> str:
        folder = args.snapshot_dir / args.worker_id
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"episode-{episodes:06d}.pt"
        torch.save({"model": policy.state_dict(), "optimizer": optimizer.state_dict(),
                    "episodes": episodes}, path)
        snapshots.append(str(path))
        return f"saved {path}"

    precision = dsec.controls().precision
    deadline = time.monotonic() + args.duration_s
    observation, _ = env.reset(seed=args.seed)
    while time.monotonic() < deadline:
        log_probs, rewards = [], []
        terminated = truncated = False
        while not (terminated or truncated):
            with dsec.autocast():
                logits = policy(torch.as_tensor(observation, dtype=torch.float32))
            distribution = torch.distributions.Categorical(logits=logits.float())
            action = distribution.sample()
            log_probs.append(distribution.log_prob(action))
            observation, reward, terminated, truncated, _info = env.step(int(action))
            rewards.append(float(reward))
        loss = -(torch.stack(log_probs) * discounted_returns(rewards, 0.99)).sum()
        optimizer.zero_grad()
        precision.backward(loss)  # loss scaling while fp16
        dsec.report_step(loss)
        precision.step(optimizer)
        episodes += 1
        dsec.report_episode_end(
            float(np.sum(rewards)), len(rewards), terminated=terminated, truncated=truncated,
            # No reason: every CartPole episode ends the same way, which is not being stuck.
            termination_reason=None,
        )
        observation, _ = env.reset()

    counters = dsec.shutdown()
    summary = {
        "worker_id": args.worker_id,
        "episodes": episodes,
        "snapshots": len(snapshots),
        "samples_sent": counters.samples_sent if counters else 0,
        "samples_dropped": counters.samples_dropped if counters else 0,
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

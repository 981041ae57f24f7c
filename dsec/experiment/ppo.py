"""A small PPO (clipped surrogate, GAE) in torch for classic-control tasks on CPU."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class PpoConfig:
    envs: int = 4
    rollout_steps: int = 64  # per environment: envs * rollout_steps samples per update
    epochs: int = 2
    minibatches: int = 4
    learning_rate: float = 2.5e-3
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    max_grad_norm: float = 0.5
    hidden: int = 64


def gae(
    rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, last_values: np.ndarray,
    gamma: float, lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates and returns for a [steps, envs] rollout.

    ``dones[t]`` is 1 where the episode ended at step t (no bootstrap past it)."""
    steps = rewards.shape[0]
    advantages = np.zeros_like(rewards, dtype=np.float64)
    running = np.zeros(rewards.shape[1], dtype=np.float64)
    for t in reversed(range(steps)):
        next_values = last_values if t == steps - 1 else values[t + 1]
        alive = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * alive - values[t]
        running = delta + gamma * lam * alive * running
        advantages[t] = running
    return advantages, advantages + values


class ActorCritic(nn.Module):
    def __init__(self, observations: int, actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.policy = nn.Sequential(nn.Linear(observations, hidden), nn.Tanh(),
                                    nn.Linear(hidden, hidden), nn.Tanh(),
                                    nn.Linear(hidden, actions))
        self.value = nn.Sequential(nn.Linear(observations, hidden), nn.Tanh(),
                                   nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(obs), self.value(obs).squeeze(-1)


def ppo_loss(
    model: ActorCritic, obs: torch.Tensor, actions: torch.Tensor, old_log_probs: torch.Tensor,
    advantages: torch.Tensor, returns: torch.Tensor, config: PpoConfig,
) -> torch.Tensor:
    logits, values = model(obs)
    distribution = torch.distributions.Categorical(logits=logits.float())
    log_probs = distribution.log_prob(actions)
    ratio = torch.exp(log_probs - old_log_probs)
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    surrogate = torch.min(ratio * advantages,
                          ratio.clamp(1 - config.clip, 1 + config.clip) * advantages)
    value_loss = (values.float() - returns).pow(2).mean()
    return (-surrogate.mean() + config.value_coef * value_loss
            - config.entropy_coef * distribution.entropy().mean())


@dataclass
class Rollout:
    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    def minibatches(self, count: int, generator: torch.Generator) -> list[torch.Tensor]:
        order = torch.randperm(self.obs.shape[0], generator=generator)
        return list(order.chunk(count))


def build_rollout(
    obs: np.ndarray, actions: np.ndarray, log_probs: np.ndarray, rewards: np.ndarray,
    values: np.ndarray, dones: np.ndarray, last_values: np.ndarray, config: PpoConfig,
) -> Rollout:
    advantages, returns = gae(rewards, values, dones, last_values, config.gamma,
                              config.gae_lambda)

    def flat(array: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(array.reshape(-1, *array.shape[2:]), dtype=dtype)

    return Rollout(flat(obs), flat(actions, torch.int64), flat(log_probs), flat(advantages),
                   flat(returns))


def ppo_update(model: ActorCritic, optimizer: torch.optim.Optimizer, rollout: Rollout,
               config: PpoConfig, generator: torch.Generator) -> None:
    """One update on one worker alone: the epochs over shuffled minibatches, clipped."""
    for _epoch in range(config.epochs):
        for index in rollout.minibatches(config.minibatches, generator):
            loss = ppo_loss(model, rollout.obs[index], rollout.actions[index],
                            rollout.log_probs[index], rollout.advantages[index],
                            rollout.returns[index], config)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()

"""The experiment's PPO: GAE by hand, and it learns CartPole a little in a few updates."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from dsec.experiment.ppo import ActorCritic, PpoConfig, build_rollout, gae, ppo_update


def test_gae_with_lambda_one_is_the_discounted_return_minus_the_value() -> None:
    rewards = np.array([[1.0], [1.0], [1.0]])
    values = np.array([[0.5], [0.5], [0.5]])
    dones = np.array([[0.0], [0.0], [1.0]])
    advantages, returns = gae(rewards, values, dones, np.array([9.0]), gamma=0.9, lam=1.0)
    assert returns[:, 0] == pytest.approx([1 + 0.9 + 0.81, 1 + 0.9, 1.0])
    assert advantages[:, 0] == pytest.approx(returns[:, 0] - 0.5)


def test_gae_bootstraps_from_the_last_value_when_the_episode_goes_on() -> None:
    _advantages, returns = gae(np.array([[0.0]]), np.array([[0.0]]), np.array([[0.0]]),
                              np.array([2.0]), gamma=0.5, lam=0.95)
    assert returns[0, 0] == pytest.approx(1.0)


def test_ppo_learns_cartpole_a_little() -> None:
    torch.manual_seed(0)
    config = PpoConfig()
    envs = [gym.make("CartPole-v1") for _ in range(config.envs)]
    obs = np.stack([env.reset(seed=i)[0] for i, env in enumerate(envs)])
    model = ActorCritic(4, 2, config.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, eps=1e-5)
    generator = torch.Generator().manual_seed(0)
    running = np.zeros(config.envs)
    finished: list[list[float]] = []
    for _update in range(25):
        shape = (config.rollout_steps, config.envs)
        b = {k: np.zeros(shape, np.float32) for k in ("act", "logp", "rew", "val", "done")}
        b_obs = np.zeros((*shape, 4), np.float32)
        returns_this_update = []
        for t in range(config.rollout_steps):
            with torch.no_grad():
                logits, values = model(torch.as_tensor(obs))
                distribution = torch.distributions.Categorical(logits=logits)
                actions = distribution.sample()
            b_obs[t], b["act"][t] = obs, actions.numpy()
            b["logp"][t], b["val"][t] = distribution.log_prob(actions).numpy(), values.numpy()
            for i, env in enumerate(envs):
                obs[i], reward, terminated, truncated, _ = env.step(int(actions[i]))
                running[i] += reward
                b["rew"][t, i] = reward
                if terminated or truncated:
                    b["done"][t, i] = 1.0
                    returns_this_update.append(running[i])
                    running[i] = 0.0
                    obs[i], _ = env.reset()
        finished.append(returns_this_update)
        with torch.no_grad():
            _, last = model(torch.as_tensor(obs))
        rollout = build_rollout(b_obs, b["act"].astype(np.int64), b["logp"], b["rew"],
                                b["val"], b["done"], last.numpy(), config)
        ppo_update(model, optimizer, rollout, config, generator)
    early = np.mean([r for update in finished[:3] for r in update])
    late = np.mean([r for update in finished[-3:] for r in update])
    assert late > 2 * early

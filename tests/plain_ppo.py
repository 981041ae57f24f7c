"""A plain PPO on CartPole (clipped surrogate, GAE) in torch and gymnasium, with no dsec in it.

Under torchrun (``RANK`` set) it trains one DDP model over a gloo process group, each rank
on environments of its own, and all-reduces its mean return after each update. It prints
one line per update: the update, the mean loss and the mean return of its episodes.
``dsec run`` instruments it as it is (tests/integration/test_zero_touch.py).
"""

from __future__ import annotations

import argparse
import os
import time

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
from torch import nn


def gae(rewards, values, dones, last_values, gamma=0.99, lam=0.95):
    advantages = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[1])
    for t in reversed(range(rewards.shape[0])):
        next_values = last_values if t == rewards.shape[0] - 1 else values[t + 1]
        alive = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * alive - values[t]
        running = delta + gamma * lam * alive * running
        advantages[t] = running
    return advantages, advantages + values


class ActorCritic(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.policy = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 2))
        self.value = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, obs):
        return self.policy(obs), self.value(obs).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="keep updating until this much time has passed, too")
    parser.add_argument("--envs", type=int, default=2)
    parser.add_argument("--rollout-steps", type=int, default=64)
    args = parser.parse_args()

    torch.set_num_threads(1)
    distributed = "RANK" in os.environ
    rank = int(os.environ.get("RANK", 0))
    if distributed:
        dist.init_process_group("gloo")
    torch.manual_seed(rank)
    net = ActorCritic()
    model = nn.parallel.DistributedDataParallel(net) if distributed else net
    optimizer = torch.optim.Adam(model.parameters(), lr=2.5e-3)
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1") for _ in range(args.envs)])
    obs, _ = envs.reset(seed=rank * 100)
    started_s = time.monotonic()
    update, keep_going = 0, True
    while keep_going:
        batch_obs, actions, log_probs, rewards, values, dones, returns = [], [], [], [], [], [], []
        episode_return = np.zeros(args.envs)
        with torch.no_grad():
            for _ in range(args.rollout_steps):
                logits, value = model(torch.as_tensor(obs, dtype=torch.float32))
                dist_ = torch.distributions.Categorical(logits=logits)
                action = dist_.sample()
                next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
                done = np.logical_or(terminated, truncated)
                episode_return += reward
                returns.extend(episode_return[done])
                episode_return[done] = 0.0
                batch_obs.append(obs)
                actions.append(action.numpy())
                log_probs.append(dist_.log_prob(action).numpy())
                rewards.append(reward)
                values.append(value.numpy())
                dones.append(done.astype(np.float64))
                obs = next_obs
            _, last_values = model(torch.as_tensor(obs, dtype=torch.float32))
        advantages, targets = gae(np.array(rewards), np.array(values), np.array(dones),
                                  last_values.numpy())
        flat = lambda a, dtype=torch.float32: torch.as_tensor(  # noqa: E731
            np.asarray(a).reshape(-1, *np.asarray(a).shape[2:]), dtype=dtype)
        b_obs, b_actions, b_log_probs = flat(batch_obs), flat(actions, torch.int64), flat(log_probs)
        b_adv, b_targets = flat(advantages), flat(targets)
        losses = []
        for minibatch in torch.randperm(b_obs.shape[0]).chunk(2):
            logits, value = model(b_obs[minibatch])
            dist_ = torch.distributions.Categorical(logits=logits)
            ratio = torch.exp(dist_.log_prob(b_actions[minibatch]) - b_log_probs[minibatch])
            adv = b_adv[minibatch]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            surrogate = torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
            loss = (-surrogate.mean() + 0.5 * (value - b_targets[minibatch]).pow(2).mean()
                    - 0.01 * dist_.entropy().mean())
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            losses.append(loss.item())
        more = update + 1 < args.updates or time.monotonic() - started_s < args.seconds
        # [mean return, wants another update]: the ranks go on together or stop together
        shared = torch.tensor([float(np.mean(returns)) if returns else 0.0, float(more)])
        if distributed:
            dist.all_reduce(shared)
            shared /= dist.get_world_size()
        keep_going = shared[1].item() == 1.0
        if rank == 0:
            print(f"update {update} loss {np.mean(losses):.6f} return {shared[0].item():.3f}",
                  flush=True)
        update += 1
    envs.close()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

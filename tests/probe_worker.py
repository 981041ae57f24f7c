"""One rank of a real training job for the end-to-end probe test, run as a script.

REINFORCE on gymnasium CartPole, DDP over a gloo process group, with every probe on:
optimizer hooks, the gym wrapper, DDP bucket and explicit all-reduce timing, clipping
through ``dsec.clip_grad_norm_``, a non-finite loss on one step, and GPU samples from
the NVML test double (this host has no GPU). Kafka settings come from ``DSEC_*``.
Prints the probe's final counters as JSON.
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import torch
import torch.distributed as dist
from nvml_double import NvmlTestDouble
from torch import nn

import dsec
from dsec.ingest import ProbeConfig
from dsec.ingest.nvml import NvmlSampler


def cartpole_reason(observation, _info) -> str:
    return "cart_out_of_bounds" if abs(float(observation[0])) > 2.4 else "pole_fell"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--episodes", type=int, default=6)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=args.rank, world_size=args.world_size)
    policy = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
    model = nn.parallel.DistributedDataParallel(policy)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    config = ProbeConfig(heartbeat_interval_s=0.5, grad_norm_every_n_steps=1,
                         step_sample_every_n_steps=1,
                         gpu_sample_interval_s=0)
    runtime = dsec.init(worker_id=f"rank{args.rank}", node_id="node-a", optimizer=optimizer,
                        probe_config=config, actuate=False)
    gpus = NvmlSampler(runtime.probe, 0.2, nvml=NvmlTestDouble()).start()
    dsec.watch_ddp(model)
    env = dsec.wrap_env(gym.make("CartPole-v1"), reason_fn=cartpole_reason)

    for episode in range(args.episodes):
        observation, _ = env.reset(seed=args.rank * 1000 + episode)
        log_probs, rewards, done = [], [], False
        while not done:
            logits = model(torch.as_tensor(observation, dtype=torch.float32))
            distribution = torch.distributions.Categorical(logits=logits)
            action = distribution.sample()
            log_probs.append(distribution.log_prob(action))
            observation, reward, terminated, truncated, _ = env.step(int(action))
            rewards.append(float(reward))
            done = terminated or truncated
        returns = torch.tensor(rewards).flip(0).cumsum(0).flip(0)
        loss = -(torch.stack(log_probs) * (returns - returns.mean())).mean()
        optimizer.zero_grad()
        loss.backward()
        if episode % 2:
            dsec.clip_grad_norm_(model.parameters(), 1.0)
        dsec.report_step(loss * float("nan") if episode == 3 else loss)
        optimizer.step()
        mean_return = torch.tensor([sum(rewards)])
        dist.all_reduce(mean_return)

    dist.barrier()
    gpus.stop()
    counters = dsec.shutdown()
    dist.destroy_process_group()
    print(json.dumps(counters.__dict__))


if __name__ == "__main__":
    main()

"""A worker process for the node actuator tests: trains a tiny DDP model (a one-rank gloo
group) with every hook attached, applies what its node actuator sends, and writes the
settings in force and requested to a JSON file at every step."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import dsec


def main(worker_id: str, state_path: str) -> None:
    target = Path(state_path)
    store = target.parent / f"gloo-{os.getpid()}"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    runtime = dsec.init(worker_id=worker_id, node_id="node-a", optimizer=optimizer)
    dsec.watch_ddp(model)
    controls = dsec.controls()

    def sample() -> None:  # the asynchronous sampling thread, waiting at the gate
        while True:
            controls.sampler.wait_until_running(0.05)
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    while True:
        with controls.grad_accumulation.micro_step(model) as sync:
            with dsec.autocast():
                loss = model(torch.randn(8, 4)).float().pow(2).mean()
            controls.grad_accumulation.scale(loss).backward()
        if sync:
            optimizer.step()  # the step post-hook applies what the node actuator sent
            optimizer.zero_grad()
        state = {**controls.in_force(), "requested": controls.requested(), "pid": os.getpid(),
                 "registered": bool(runtime.channel and runtime.channel.registered)}
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(target)
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

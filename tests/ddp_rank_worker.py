"""One rank of a real gloo DDP group for the node actuator tests: trains a tiny model
through ``dsec.watch_ddp`` (the controls' comm hook) and writes, for every step, the sync
priority its hook used, its own gradient and the gradient DDP averaged, one JSON line a
step, until a stop file appears (the ranks agree on the step they stop at)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import dsec


def main(rank: int, world: int, store: str, out: str, stop: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)  # the same weights on every rank, as DDP requires
    model = DistributedDataParallel(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay put
    runtime = dsec.init(worker_id=f"rank-{rank}", node_id="node-a", optimizer=optimizer)
    dsec.watch_ddp(model)
    controls = dsec.controls()
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.module.state_dict())
    step = 0
    with Path(out).open("w", buffering=1) as lines:
        while True:
            registered = bool(runtime.channel and runtime.channel.registered)
            flags = torch.tensor([float(Path(stop).exists()), float(not registered)])
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            if flags[0] > 0:
                break
            generator = torch.Generator().manual_seed(1000 * step + rank)
            x = torch.randn(8, 4, generator=generator)
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            reference.zero_grad()
            reference(x).pow(2).mean().backward()
            local = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
            lines.write(json.dumps({"step": step, "level": controls.sync_priority.in_force,
                                    "all_registered": bool(flags[1] == 0),
                                    "got": got.tolist(), "local": local.tolist()}) + "\n")
            optimizer.step()  # the step boundary: commands are applied after it
            step += 1
            time.sleep(0.02)
    dsec.shutdown()
    dist.barrier()
    dist.destroy_process_group()
    # gloo's threads can abort the interpreter's own exit; the lines are written
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])

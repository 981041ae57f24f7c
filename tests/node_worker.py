"""A worker process for the node actuator tests: trains a tiny model, applies what its node
actuator sends, and writes its actual settings to a JSON file at every step."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

import dsec


def main(worker_id: str, state_path: str) -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    runtime = dsec.init(worker_id=worker_id, node_id="node-a", optimizer=optimizer)
    target = Path(state_path)
    while True:
        with dsec.autocast():
            loss = model(torch.randn(8, 4)).float().pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # the step post-hook applies what the node actuator sent
        state = {**dsec.controls().state(), "pid": os.getpid(),
                 "registered": bool(runtime.channel and runtime.channel.registered)}
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(target)
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

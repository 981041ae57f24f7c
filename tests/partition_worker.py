"""A training worker for the network-partition test, run inside a network namespace: a tiny
model and its optimizer under ``dsec.init`` (the probe publishing to Kafka through the
namespace's veth link, commands from the node actuator over the node's socket), a sampler
thread waiting at the gate, and the probe's counters and the settings in force written to
a JSON file after every step. Kafka settings come from ``DSEC_*``."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch

import dsec


def main(worker_id: str, node_id: str, state_path: str) -> None:
    target = Path(state_path)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    runtime = dsec.init(worker_id=worker_id, node_id=node_id, optimizer=optimizer)
    controls = dsec.controls()

    def sample() -> None:  # the asynchronous sampling thread, waiting at the gate
        while True:
            controls.sampler.wait_until_running(0.05)
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    while True:
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()  # the step post-hook applies what the node actuator sent
        optimizer.zero_grad()
        state = {"in_force": controls.in_force(), "pid": os.getpid(),
                 "registered": bool(runtime.channel and runtime.channel.registered),
                 "probe": asdict(runtime.probe.counters())}
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(target)
        time.sleep(0.01)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])

"""The probe's cost on a small GPU training step: blocks of steps with the probe off and
on, alternating, timed on the wall clock with the device synchronised at each block's end
(``dsec bench probe-overhead``'s method and reference network, on the GPU). On, the probe
samples CUDA memory and NVML as well. The figures are reported, not judged: what a step
this small can afford is the reader's call."""

from __future__ import annotations

import time
from typing import Any

from dsec.bench.gpu_check.outcome import Outcome
from dsec.bench.probe_overhead import (
    AcknowledgingTransport,
    block_summary,
    reference_model,
    reference_steps,
)


def run(device: str = "cuda", block_pairs: int = 40, steps_per_block: int = 50,
        warmup_steps: int = 200) -> Outcome:
    import torch

    from dsec.ingest import ProbeConfig
    from dsec.runtime import WorkerRuntime
    from dsec.schemas import WorkerIdentity
    from dsec.schemas.settings import DsecSettings

    torch.manual_seed(0)
    model = reference_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs = torch.randn(256, 64, device=device)
    targets = torch.randn(256, 64, device=device)
    settings = DsecSettings(bootstrap="127.0.0.1:9", topic_prefix="doctor", job_id="doctor")
    runtime = WorkerRuntime(
        settings, WorkerIdentity(job_id="doctor", worker_id="doctor-0", node_id="doctor"),
        ProbeConfig(), actuate=False, transport=AcknowledgingTransport()).start()
    probe = runtime.probe

    def block(probe_on: bool, steps: int) -> float:
        """Wall milliseconds per step."""
        if probe_on:
            probe.watch(optimizer)
        if device != "cpu":
            torch.cuda.synchronize()
        started = time.perf_counter()
        reference_steps(model, optimizer, inputs, targets, probe if probe_on else None, steps)
        if device != "cpu":
            torch.cuda.synchronize()
        if probe_on:
            probe.unwatch()
        return (time.perf_counter() - started) * 1000.0 / steps

    try:
        block(False, warmup_steps)
        block(True, warmup_steps)
        times: dict[bool, list[float]] = {False: [], True: []}
        for pair in range(block_pairs):
            for probe_on in ((False, True) if pair % 2 == 0 else (True, False)):
                times[probe_on].append(block(probe_on, steps_per_block))
        nvml = bool(runtime.nvml is not None and runtime.nvml.available)
    finally:
        counters = runtime.shutdown()
    figures: dict[str, Any] = {
        **block_summary(times[False], times[True]),
        "clock": "wall, device synchronised at each block's end",
        "device": device,
        "blocks_per_side": block_pairs,
        "steps_per_block": steps_per_block,
        "nvml": nvml,
        "samples_sent": counters.samples_sent,
        "samples_dropped": counters.samples_dropped,
    }
    return Outcome("ok", "", figures)


def check() -> Outcome:
    return run("cuda")

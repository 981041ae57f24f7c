"""``dsec bench probe-overhead``: the probe's cost on the hardest case, a tiny fast step.

The reference step is an MLP policy network of ~100k parameters, batch 256, Adam, one
torch thread (about 2 ms on a CPU core). Short blocks of steps with the probe off and on
alternate in one run (off-on, on-off, ...), so drift and noise hit both sides alike; the
cost is the median difference between neighbouring blocks' mean step times (see
``block_summary``), so a cost paid every Nth step counts.
The flusher's work (encoding, the Kafka client) runs on its own thread every flush
interval (250 ms) and lands in whichever block is running, so about half of it is charged
to the off side: an understatement of about 0.05 % of the step (the flusher's encoding and
sending cost about 0.1 % of it), said here rather than hidden.
"On" is every signal at its default settings: optimizer hooks (sampled step time and
gradient norm, NaN/Inf flags), the loss handed over every step, an episode
report every 20 steps, gradient-sync timing, CUDA memory and NVML when present, the step
callbacks, heartbeats, and the flusher shipping batches to Kafka. The probe's thread runs
throughout; its work comes from the on-blocks.

Two clocks time every block: the process's CPU time (every thread of the process, the
probe's own included, but not time lost to other processes on a shared machine) and the
wall clock. ``--clock`` picks which one the headline figures use; both are printed.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

EPISODE_EVERY_N_STEPS = 20


class Clock(StrEnum):
    cpu = "cpu"
    wall = "wall"


@dataclass(frozen=True)
class OverheadOptions:
    block_pairs: int = 150
    steps_per_block: int = 50
    clock: Clock = Clock.cpu
    warmup_steps: int = 300
    bootstrap: str | None = None  # a running broker; else a local one, else in-memory
    local_broker: bool = True


class AcknowledgingTransport:
    """Accepts and acknowledges every message at once: the probe's own cost, no client's."""

    def __init__(self) -> None:
        self._pending: list = []

    def send(self, topic: str, key: bytes, value: bytes, on_delivery: Any) -> bool:
        self._pending.append(on_delivery)
        return True

    def poll(self) -> None:
        pending, self._pending = self._pending, []
        for on_delivery in pending:
            on_delivery(True, "")

    def flush(self, timeout_s: float) -> int:
        self.poll()
        return 0

    def close(self) -> None:
        self.poll()


def reference_model() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 64)
    )


def reference_steps(model: Any, optimizer: Any, inputs: Any, targets: Any, probe: Any,
                    steps: int) -> None:
    """``steps`` training steps; a ``probe`` (None: off) is handed every loss and an
    episode every ``EPISODE_EVERY_N_STEPS`` steps."""
    for step in range(1, steps + 1):
        loss = (model(inputs) - targets).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        if probe is not None:
            probe.note_loss(loss)
        optimizer.step()
        if probe is not None and step % EPISODE_EVERY_N_STEPS == 0:
            probe.record_episode(200.0, EPISODE_EVERY_N_STEPS)


def median_ci95(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95 % interval of the median: the order statistics k and n-1-k
    (0-based), k = floor(n/2 - 0.98 sqrt(n)), the normal approximation of the sign test."""
    ordered = sorted(values)
    n = len(ordered)
    k = max(0, math.floor(n / 2 - 0.98 * math.sqrt(n)))
    return ordered[k], ordered[n - 1 - k]


def block_summary(off_ms: list[float], on_ms: list[float]) -> dict[str, Any]:
    """The probe's cost from pairs of neighbouring blocks (off, on).

    A shared machine drifts by several percent over a run, more than the cost measured, so
    the cost is the median of the paired differences (each pair saw the same moment of the
    machine), with its 95 % interval; ``step_ms_on`` is the median off-block plus that
    cost. ``ratio_of_medians`` compares the two sides' medians without pairing, for
    reference: it carries the drift (about +-0.8 % on this kind of machine).
    """
    step_ms_off = statistics.median(off_ms)
    differences = [on - off for on, off in zip(on_ms, off_ms, strict=True)]
    cost_ms = statistics.median(differences)
    low_ms, high_ms = median_ci95(differences)
    return {
        "step_ms_off": round(step_ms_off, 4),
        "step_ms_on": round(step_ms_off + cost_ms, 4),
        "overhead_ratio": round(1 + cost_ms / step_ms_off, 4),
        "overhead_ratio_ci95": [round(1 + low_ms / step_ms_off, 4),
                                round(1 + high_ms / step_ms_off, 4)],
        "ratio_of_medians": round(statistics.median(on_ms) / step_ms_off, 4),
    }


def _start_transport(options: OverheadOptions, stack: list) -> tuple[str, str | None]:
    """(transport description, bootstrap or None for in-memory)."""
    if options.bootstrap:
        return f"kafka at {options.bootstrap}", options.bootstrap
    if options.local_broker:
        try:
            from dsec.infra.kafka_local import LocalKafka

            folder = tempfile.TemporaryDirectory(prefix="dsec-bench-")
            stack.append(folder.cleanup)
            broker = LocalKafka(data_dir=Path(folder.name) / "kafka")
            broker.start()
            stack.append(broker.stop)
            return f"kafka, local broker at {broker.bootstrap}", broker.bootstrap
        except Exception as exc:
            return f"in-memory, acknowledging at once (no local broker: {exc})", None
    return "in-memory, acknowledging at once (no broker asked for)", None


def run_probe_overhead(options: OverheadOptions) -> dict[str, Any]:
    import torch

    from dsec.infra.topics import ensure_topics
    from dsec.ingest import ProbeConfig
    from dsec.runtime import WorkerRuntime
    from dsec.schemas import WorkerIdentity
    from dsec.schemas.settings import DsecSettings

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = reference_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs, targets = torch.randn(256, 64), torch.randn(256, 64)

    cleanup: list = []
    try:
        transport_name, bootstrap = _start_transport(options, cleanup)
        settings = DsecSettings(bootstrap=bootstrap or "127.0.0.1:9", topic_prefix="bench",
                                job_id="bench")
        if bootstrap:
            ensure_topics(settings)
        config = ProbeConfig()
        runtime = WorkerRuntime(
            settings, WorkerIdentity(job_id="bench", worker_id="bench-0", node_id="bench"),
            config, actuate=False,
            transport=None if bootstrap else AcknowledgingTransport(),
        ).start()
        probe = runtime.probe
        cleanup.append(runtime.shutdown)

        def block(probe_on: bool, steps: int) -> tuple[float, float]:
            """(CPU ms, wall ms) per step."""
            if probe_on:
                probe.watch(optimizer)
            cpu_started, wall_started = time.process_time(), time.perf_counter()
            reference_steps(model, optimizer, inputs, targets, probe if probe_on else None,
                            steps)
            cpu_ms = (time.process_time() - cpu_started) * 1000.0 / steps
            wall_ms = (time.perf_counter() - wall_started) * 1000.0 / steps
            if probe_on:
                probe.unwatch()
            return cpu_ms, wall_ms

        block(False, options.warmup_steps)
        block(True, options.warmup_steps)
        times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for pair in range(options.block_pairs):
            order = (False, True) if pair % 2 == 0 else (True, False)
            for probe_on in order:
                times[probe_on].append(block(probe_on, options.steps_per_block))
        norm_interval = probe.grad_norm_interval_steps
        sample_interval = probe.step_sample_interval_steps
        cleanup.remove(runtime.shutdown)
        counters = runtime.shutdown()
        nvml = bool(runtime.nvml is not None and runtime.nvml.available)
        # the Kafka client goes before the broker does, so it has nothing to complain about
        runtime = probe = block = None  # type: ignore[assignment]
        gc.collect()
    finally:
        for undo in reversed(cleanup):
            undo()

    cpu = block_summary([t[0] for t in times[False]], [t[0] for t in times[True]])
    wall = block_summary([t[1] for t in times[False]], [t[1] for t in times[True]])
    headline = cpu if options.clock is Clock.cpu else wall
    return {
        **headline,
        "clock": f"{options.clock.value} (process CPU time)" if options.clock is Clock.cpu
        else "wall",
        "cpu": cpu,
        "wall": wall,
        "blocks_per_side": options.block_pairs,
        "steps_per_block": options.steps_per_block,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": 256,
        "torch_threads": 1,
        "step_sample_every_n_steps": config.step_sample_every_n_steps or "adaptive",
        "step_sample_interval_steps": sample_interval,
        "grad_norm_every_n_steps": config.grad_norm_every_n_steps or "adaptive",
        "grad_norm_interval_steps": norm_interval,
        "episode_every_n_steps": EPISODE_EVERY_N_STEPS,
        "transport": transport_name,
        "nvml": nvml,
        "cuda": bool(torch.cuda.is_available()),
        "samples_sent": counters.samples_sent,
        "samples_dropped": counters.samples_dropped,
    }


def probe_overhead(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    block_pairs: Annotated[int, typer.Option(min=1)] = 150,
    steps_per_block: Annotated[int, typer.Option(min=10)] = 50,
    clock: Annotated[Clock, typer.Option(help="The clock of the headline figures.")] = Clock.cpu,
    bootstrap: Annotated[
        str | None, typer.Option(help="Measure against this broker instead of a local one.")
    ] = None,
    local_broker: Annotated[
        bool, typer.Option(help="Start a local broker when no bootstrap is given.")
    ] = True,
) -> None:
    """Step time of the reference training step with the probe off and on, side by side."""
    result = run_probe_overhead(OverheadOptions(
        block_pairs=block_pairs, steps_per_block=steps_per_block, clock=clock,
        bootstrap=bootstrap, local_broker=local_broker,
    ))
    if as_json:
        print(json.dumps(result))
        return
    for name, value in result.items():
        typer.echo(f"{name:>24}  {value}")

"""What a snapshot of GPU state costs the training thread.

The snapshotter copies model and optimizer tensors to pinned host buffers on its own
thread while the next forward and backward run, and holds only the next optimizer step
until the copy is done. Measured: the step that takes a snapshot against a plain step,
and both against a blocking copy of the same state. The copy overlaps compute when the
snapshot step costs less than half the blocking copy on top of a plain step.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

from dsec.bench.gpu_check.outcome import Outcome

OVERLAP_NEEDED = 0.5


def _synchronise(device: str) -> None:
    import torch

    if device != "cpu":
        torch.cuda.synchronize()


def run(device: str = "cuda", hidden: int = 2048, layers: int = 4, batch: int = 4096,
        plain_steps: int = 10, snapshots: int = 3) -> Outcome:
    import torch
    from torch import nn

    from dsec.actuators.snapshotter import SnapshotConfig, Snapshotter

    torch.manual_seed(0)
    model = nn.Sequential(*[module for _ in range(layers)
                            for module in (nn.Linear(hidden, hidden), nn.ReLU())]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    inputs = torch.randn(batch, hidden, device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(inputs).pow(2).mean().backward()
        optimizer.step()

    def timed(work: Any) -> float:
        _synchronise(device)
        started = time.perf_counter()
        work()
        _synchronise(device)
        return (time.perf_counter() - started) * 1000.0

    for _ in range(3):  # Adam's state exists, the kernels are warm
        step()
    state = list(model.state_dict().values()) + [
        value for values in optimizer.state.values() for value in values.values()
        if torch.is_tensor(value)]
    pinned = device != "cpu"
    buffers = [torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pinned)
               for t in state]

    def blocking_copy() -> None:
        for buffer, tensor in zip(buffers, state, strict=True):
            buffer.copy_(tensor, non_blocking=pinned)

    copy_ms = statistics.median(timed(blocking_copy) for _ in range(3))
    step_ms = statistics.median(timed(step) for _ in range(plain_steps))
    snapshot_step_ms, blocking_ms = [], []
    with tempfile.TemporaryDirectory(prefix="dsec-doctor-snapshot-") as folder:
        snapshotter = Snapshotter(model, optimizer, SnapshotConfig(directory=folder))
        try:
            for index in range(snapshots):
                blocked_before = snapshotter.stats.blocking_ms_total

                def snapshot_step(index: int = index) -> None:
                    snapshotter.request(global_step=index)
                    step()  # the optimizer step waits for the copy

                snapshot_step_ms.append(timed(snapshot_step))
                blocking_ms.append(snapshotter.stats.blocking_ms_total - blocked_before)
                snapshotter.wait_idle(timeout_s=60.0)
            stats = snapshotter.stats
        finally:
            snapshotter.close()
    extra_ms = statistics.median(snapshot_step_ms) - step_ms
    overlap = 1.0 - extra_ms / copy_ms if copy_ms > 0 else 0.0
    figures = {
        "device": device,
        "state_bytes": sum(t.numel() * t.element_size() for t in state),
        "blocking_copy_ms": round(copy_ms, 3),
        "step_ms": round(step_ms, 3),
        "snapshot_step_ms": [round(ms, 3) for ms in snapshot_step_ms],
        "snapshot_extra_ms": round(extra_ms, 3),
        "training_thread_blocked_ms": [round(ms, 3) for ms in blocking_ms],
        "overlap_ratio": round(overlap, 3),
        "snapshots_taken": stats.taken,
        "snapshots_failed": stats.failed,
        "written_bytes": stats.written_bytes,
    }
    problems = []
    if stats.taken != snapshots or stats.failed:
        problems.append(f"{stats.taken} of {snapshots} snapshots taken, {stats.failed} failed")
    if device != "cpu" and overlap < OVERLAP_NEEDED:
        problems.append(
            f"the device-to-host copy did not overlap compute: a snapshot step took "
            f"{extra_ms:.1f} ms more than a plain one, a blocking copy takes {copy_ms:.1f} ms")
    return Outcome.judged(problems, figures)


def check() -> Outcome:
    return run("cuda")

"""``dsec bench snapshot``: a durable ``torch.save`` against a dsec snapshot, in one run.

Both are taken from the same training loop on the same reference model, where
Adam updates every parameter every step. Blocking time is what the training
thread waits: for ``torch.save``, the serialise + write + fsync; for a snapshot,
the call at the step boundary plus any wait before the next optimizer step for
the host copy to finish (the copy overlaps forward and backward).

The headline is the snapshot SPEC §5 defines, the minimal state to resume: weights,
int8-quantised, with the step and the episode head, and no optimizer moments (a resumed
worker restarts Adam's moments; the full checkpoint keeps them). The same run also
measures the full state, weights and Adam moments losslessly, under
``full_state_lossless``: the figures for a worker that needs a bit-exact resume.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

ENCODING_NOTE = (
    "only chunks whose blake2b content hash changed are written; floats XORed against the "
    "keyframe (unchanged sign/exponent/high-mantissa bits become zeros) and split into "
    "byte planes, int8 codes subtracted from the keyframe's, then zstd"
)


@dataclass(frozen=True)
class SnapshotBenchOptions:
    hidden: int = 2112  # 8.9 M parameters: 107 MB (102 MiB) of fp32 weights and Adam moments
    batch: int = 32
    steps: int = 24
    snapshot_every_steps: int = 2
    full_checkpoints: int = 3
    lr: float = 1e-4
    keyframe_every: int = 16
    quantise_weights: bool = False
    quantise_optimizer: bool = False
    optimizer_state: bool = True  # snapshot the Adam moments too
    directory: Path | None = None
    seed: int = 0


# The snapshot of SPEC §5 (the headline), and the full state without loss.
MINIMAL_STATE = {"quantise_weights": True, "quantise_optimizer": False, "optimizer_state": False}
FULL_STATE_LOSSLESS = {"quantise_weights": False, "quantise_optimizer": False,
                       "optimizer_state": True}


def _reference(options: SnapshotBenchOptions) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(options.seed)
    width = options.hidden
    model = torch.nn.Sequential(
        torch.nn.Linear(width // 2, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width // 2),
    )
    return model, torch.optim.Adam(model.parameters(), lr=options.lr)


def _state_bytes(model: Any, optimizer: Any) -> int:
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for values in optimizer.state_dict()["state"].values():
        total += sum(v.numel() * v.element_size() for v in values.values() if hasattr(v, "numel"))
    return total


def _durable_torch_save(state: dict, path: Path) -> None:
    import torch

    with path.open("wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())


def run_snapshot_bench(options: SnapshotBenchOptions) -> dict[str, Any]:
    import torch

    from dsec.actuators.restore import restore
    from dsec.actuators.snapshotter import SnapshotConfig, Snapshotter

    with tempfile.TemporaryDirectory(prefix="dsec-bench-", dir=options.directory) as scratch:
        root = Path(scratch)
        model, optimizer = _reference(options)
        x = torch.randn(options.batch, options.hidden // 2)
        target = torch.randn(options.batch, options.hidden // 2)

        def step() -> None:
            loss = (model(x + 0.1 * torch.randn_like(x)) - target).pow(2).mean()
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
            optimizer.step()

        for _ in range(2):
            step()
        save_ms: list[float] = []
        full_path = root / "full.pt"
        for _ in range(options.full_checkpoints):
            step()
            started = time.perf_counter()
            _durable_torch_save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, full_path
            )
            save_ms.append((time.perf_counter() - started) * 1000.0)
        full_bytes = full_path.stat().st_size
        full_path.unlink()

        snapshotted = optimizer if options.optimizer_state else None
        snapshots = Snapshotter(model, snapshotted, SnapshotConfig(
            directory=root / "snapshots", keyframe_every=options.keyframe_every,
            quantise_weights=options.quantise_weights,
            quantise_optimizer=options.quantise_optimizer,
        ))
        for index in range(options.steps):
            step()  # the optimizer pre-hook waits here for a copy still in flight
            if index % options.snapshot_every_steps == 0:
                snapshots.wait_idle()  # one snapshot in flight at a time
                snapshots.request(index, {"episode_head": index})
        step()
        snapshots.close()
        blocking_ms = snapshots.stats.blocking_ms
        written = snapshots.stats.written_bytes
        kinds = snapshots.stats.keyframes
        incremental = [size for size, key in zip(written, kinds, strict=True) if not key]

        fresh_model, fresh_optimizer = _reference(options)
        started = time.perf_counter()
        restored = restore(root / "snapshots", fresh_model,
                           fresh_optimizer if options.optimizer_state else None,
                           restore_rng=False)
        restore_ms = (time.perf_counter() - started) * 1000.0

    torch_save_ms = statistics.median(save_ms)
    snapshot_ms = statistics.median(blocking_ms)
    incremental_mean = statistics.fmean(incremental) if incremental else float(written[0])
    return {
        "torch_save_blocking_ms": round(torch_save_ms, 2),
        "snapshot_blocking_ms": round(snapshot_ms, 2),
        "blocking_ratio": round(snapshot_ms / torch_save_ms, 4),
        "full_bytes": full_bytes,
        "incremental_bytes_mean": round(incremental_mean),
        "size_ratio": round(incremental_mean / full_bytes, 4),
        "restore_ms": round(restore_ms, 2),
        "state_bytes": _state_bytes(model, optimizer),
        "snapshots": len(written),
        "keyframe_bytes": written[0],
        "keyframes": sum(kinds),
        "snapshot_blocking_ms_max": round(max(blocking_ms), 2),
        "restored_from_snapshots": len(restored.report.applied),
        "steps_between_snapshots": options.snapshot_every_steps,
        "quantised_weights": options.quantise_weights,
        "quantised_optimizer": options.quantise_optimizer,
        "optimizer_state": options.optimizer_state,
        "encoding": ENCODING_NOTE + (
            "; weights int8" if options.quantise_weights else "") + (
            "; Adam moments int8 (exp_avg_sq as its square root)"
            if options.quantise_optimizer and options.optimizer_state else "") + (
            "" if options.optimizer_state else "; no optimizer moments (SPEC §5 minimal state)"),
    }


def run_side_by_side(steps: int, snapshot_every_steps: int, directory: Path | None,
                     headline: dict[str, bool] | None = None,
                     hidden: int = SnapshotBenchOptions.hidden) -> dict[str, Any]:
    """``headline`` (default: the minimal state) and the full state without loss, on the
    same reference loop, one after the other in one run."""
    def run(config: dict[str, bool]) -> dict[str, Any]:
        return run_snapshot_bench(SnapshotBenchOptions(
            steps=steps, snapshot_every_steps=snapshot_every_steps, directory=directory,
            hidden=hidden,
            **config))

    result = run(headline or MINIMAL_STATE)
    full = run(FULL_STATE_LOSSLESS)
    result["full_state_lossless"] = {
        key: full[key] for key in (
            "torch_save_blocking_ms", "snapshot_blocking_ms", "blocking_ratio",
            "incremental_bytes_mean", "size_ratio", "restore_ms", "keyframe_bytes",
            "keyframes", "snapshots")}
    return result


def snapshot_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    steps: Annotated[int, typer.Option(min=4, max=1000)] = 24,
    snapshot_every_steps: Annotated[int, typer.Option(min=1)] = 2,
    quantise_weights: Annotated[bool, typer.Option(
        help="int8 weights in the headline snapshot.")] = MINIMAL_STATE["quantise_weights"],
    quantise_optimizer: Annotated[bool, typer.Option(
        help="int8 Adam moments in the headline snapshot.")] = False,
    optimizer_state: Annotated[bool, typer.Option(
        help="Adam moments in the headline snapshot.")] = MINIMAL_STATE["optimizer_state"],
    directory: Annotated[Path | None, typer.Option(help="Scratch folder (default: tmp).")] = None,
) -> None:
    """Training-thread blocking, size and restore time: torch.save vs dsec snapshot (the
    minimal state by default), and the full state without loss, side by side."""
    result = run_side_by_side(steps, snapshot_every_steps, directory, headline={
        "quantise_weights": quantise_weights, "quantise_optimizer": quantise_optimizer,
        "optimizer_state": optimizer_state})
    if as_json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:>28}  {value}")

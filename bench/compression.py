"""``dsec bench compression``: the bytes a rank sends per gradient sync, and what the
averaged gradient loses, at 32, 16, 8 and 4 bits in gloo groups of several sizes.

Each rank of a CPU gloo group computes real gradients of a small MLP (the same weights
on every rank, its own batches), one per step, and averages them through the comm hook
DDP would call (``GradCompression.hook``), once per setting: 32, 16, 8 and 4 bits, the
quantised ones with and without error feedback, on the same gradients. Per rank and step:

- ``wire_bytes``: what the hook counts as sent by its collectives from this rank;
- ``tcp_bytes``: what the process really sent over its TCP sockets meanwhile (gloo's
  framing and the barrier that closes the step included), from the kernel;
- ``relative_error``: ``|avg - exact| / |exact|`` of one step's average against the fp32
  average of the same gradients, the mean over steps; ``sum_relative_error`` the same for
  the sum over all steps (what the optimizer integrates, and what error feedback keeps
  from drifting).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from dsec.actuators.gradient_quantisation import payload_bytes
from dsec.actuators.quantised_all_reduce import ring_all_reduce_bytes

BATCH = 64
IN_FEATURES = 256


@dataclass(frozen=True)
class CompressionBenchOptions:
    world_sizes: tuple[int, ...] = (2, 4, 8)
    bits: tuple[int, ...] = (32, 16, 8, 4)
    steps: int = 6
    hidden: int = 1024  # MLP width: 1024 gives 1.58 M gradient values
    measure_tcp: bool = True

    def __post_init__(self) -> None:
        if not self.world_sizes or min(self.world_sizes) < 1:
            raise ValueError("world sizes must be at least 1")
        if set(self.bits) - {4, 8, 16, 32}:
            raise ValueError("bits are among 32, 16, 8 and 4")
        if self.steps < 1:
            raise ValueError("steps must be at least 1")


@dataclass(frozen=True)
class _Setting:
    bits: int
    error_feedback: bool

    @property
    def name(self) -> str:
        if self.bits >= 16:
            return f"{self.bits}"
        return f"{self.bits}{'' if self.error_feedback else '-no-ef'}"


def bench_model(hidden: int) -> Any:
    from torch import nn

    return nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                         nn.Tanh(), nn.Linear(hidden, IN_FEATURES))


def _gradients(hidden: int, rank: int, steps: int) -> list[Any]:
    import torch

    torch.manual_seed(0)  # the same weights on every rank
    model = bench_model(hidden)
    target = torch.nn.Linear(IN_FEATURES, IN_FEATURES)
    gradients = []
    for step in range(steps):
        generator = torch.Generator().manual_seed(1000 * rank + step)
        inputs = torch.randn(BATCH, IN_FEATURES, generator=generator)
        model.zero_grad()
        (model(inputs) - target(inputs).detach()).pow(2).mean().backward()
        gradients.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    return gradients


class _Bucket:
    """The two methods of DDP's ``GradBucket`` the hook reads."""

    def __init__(self, buffer: Any) -> None:
        self._buffer = buffer

    def buffer(self) -> Any:
        return self._buffer

    def index(self) -> int:
        return 0


def _settings(bits: tuple[int, ...]) -> list[_Setting]:
    settings = []
    for b in bits:
        settings.append(_Setting(b, True))
        if b < 16:
            settings.append(_Setting(b, False))
    return settings


def _relative(error: Any, reference: Any) -> float:
    return float(error.norm() / reference.norm().clamp_min(1e-30))


def _rank_main(rank: int, world: int, store: str, options: CompressionBenchOptions,
               out_path: str) -> None:
    import torch
    import torch.distributed as dist

    from dsec.actuators.grad_compression import GradCompression
    from dsec.bench.wire_bytes import tcp_bytes_sent

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        gradients = _gradients(options.hidden, rank, options.steps)
        exact = []
        for gradient in gradients:
            average = gradient.clone()
            dist.all_reduce(average)
            exact.append(average.div_(world))
        rows = []
        for setting in _settings(options.bits):
            compression = GradCompression(bits=setting.bits,
                                          error_feedback=setting.error_feedback)
            tcp_bytes, exchange_ms, errors, identical = 0, [], [], True
            total = torch.zeros_like(gradients[0])
            for gradient, reference in zip(gradients, exact, strict=True):
                buffer = gradient.clone()
                dist.barrier()
                sent_before = tcp_bytes_sent() if options.measure_tcp else None
                started = time.perf_counter()
                averaged = compression.hook(None, _Bucket(buffer)).wait()
                exchange_ms.append((time.perf_counter() - started) * 1000.0)
                dist.barrier()  # every peer has what this rank sent
                if sent_before is not None:
                    tcp_bytes += (tcp_bytes_sent() or 0) - sent_before
                errors.append(_relative(averaged - reference, reference))
                total += averaged
                first = averaged.clone()
                dist.broadcast(first, src=0)
                identical = identical and bool(torch.equal(first, averaged))
            exact_total = torch.stack(exact).sum(dim=0)
            rows.append({
                "setting": setting.name,
                "wire_bytes": compression.wire_bytes / options.steps,
                "tcp_bytes": tcp_bytes / options.steps if options.measure_tcp else None,
                "exchange_ms": statistics.median(exchange_ms),
                "relative_error": statistics.fmean(errors),
                "sum_relative_error": _relative(total - exact_total, exact_total),
                "identical": identical,
            })
        every_rank: list[Any] = [None] * world
        dist.all_gather_object(every_rank, rows)
        if rank == 0:
            Path(out_path).write_text(json.dumps({
                "numel": gradients[0].numel(), "ranks": every_rank}))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # gloo's threads can abort the interpreter's own exit; the figures are written
    os._exit(0)


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _group_rows(world: int, raw: dict[str, Any]) -> list[dict[str, Any]]:
    numel = raw["numel"]
    per_rank = raw["ranks"]
    fp32_ring_bytes = ring_all_reduce_bytes(numel * 4, world)
    rows = []
    for index, first in enumerate(per_rank[0]):
        same = [rank_rows[index] for rank_rows in per_rank]
        wire = _mean([r["wire_bytes"] for r in same]) or 0.0
        tcp = _mean([r["tcp_bytes"] for r in same])
        bits = int(first["setting"].split("-")[0])
        row: dict[str, Any] = {
            "ranks": world,
            "bits": bits,
            "error_feedback": bits < 16 and not first["setting"].endswith("no-ef"),
            "wire_bytes_per_rank_per_step": round(wire),
            "tcp_bytes_per_rank_per_step": None if tcp is None else round(tcp),
            "tcp_over_wire": None if tcp is None or not wire else round(tcp / wire, 4),
            "ratio_to_fp32": round(wire / fp32_ring_bytes, 4) if world > 1 else None,
            "relative_error": round(first["relative_error"], 6),
            "sum_relative_error": round(first["sum_relative_error"], 6),
            "exchange_ms_median": round(max(r["exchange_ms"] for r in same), 2),
            "ranks_identical": all(r["identical"] for r in same),
        }
        if bits < 16:
            # for contrast: every rank gathering every rank's whole quantised gradient
            row["all_gather_scheme_bytes"] = (world - 1) * payload_bytes(numel, bits)
        rows.append(row)
    return rows


def _flat(rows: list[dict[str, Any]], numel: int) -> dict[str, Any]:
    """Per bits: bytes per rank bounded by twice one rank's encoded gradient at every
    group size, and below fp32's at every size."""
    verdict: dict[str, Any] = {}
    for bits in sorted({r["bits"] for r in rows}, reverse=True):
        mine = [r for r in rows if r["bits"] == bits and r["ranks"] > 1]
        encoded = numel * bits // 8 if bits >= 16 else payload_bytes(numel, bits)
        fp32 = {r["ranks"]: r["wire_bytes_per_rank_per_step"] for r in rows
                if r["bits"] == 32}
        bounded = all(r["wire_bytes_per_rank_per_step"] <= 2 * encoded * 1.01 for r in mine)
        below = bits == 32 or all(
            r["wire_bytes_per_rank_per_step"] < fp32.get(r["ranks"], float("inf"))
            for r in mine)
        verdict[str(bits)] = {"bounded_by_twice_encoded": bounded, "below_fp32": below,
                              "encoded_bytes": encoded}
    return verdict


def run_compression_bench(options: CompressionBenchOptions) -> dict[str, Any]:
    import torch.multiprocessing as mp

    started_s = time.monotonic()
    rows: list[dict[str, Any]] = []
    numel = 0
    with tempfile.TemporaryDirectory(prefix="dsec-bench-compression-") as folder:
        for world in options.world_sizes:
            store = Path(folder) / f"store-{world}"
            out_path = Path(folder) / f"figures-{world}.json"
            mp.spawn(_rank_main, args=(world, str(store), options, str(out_path)),
                     nprocs=world, join=True)
            raw = json.loads(out_path.read_text())
            numel = raw["numel"]
            rows += _group_rows(world, raw)
    return {
        "gradient": {
            "numel": numel,
            "source": f"MLP {IN_FEATURES}-{options.hidden}-{options.hidden}-{IN_FEATURES}, "
                      f"batch {BATCH}, the same weights on every rank, its own batches",
            "steps": options.steps,
        },
        "backend": f"gloo on CPU over loopback TCP, {os.cpu_count()} cores for every rank",
        "flat": _flat(rows, numel),
        "rows": rows,
        "options": asdict(options),
        "wall_s": round(time.monotonic() - started_s, 1),
    }


def compression(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    world_sizes: Annotated[str, typer.Option(help="Comma-separated group sizes.")] = "2,4,8",
    steps: Annotated[int, typer.Option(min=1, help="Gradient syncs per setting.")] = 6,
    hidden: Annotated[int, typer.Option(min=8, help="Width of the MLP.")] = 1024,
    measure_tcp: Annotated[bool, typer.Option(
        help="Read the bytes really sent from the kernel (Linux).")] = True,
) -> None:
    """Bytes per rank per gradient sync and the averaged gradient's error, by bits and
    group size."""
    try:
        sizes = tuple(int(size) for size in world_sizes.split(",") if size.strip())
        options = CompressionBenchOptions(world_sizes=sizes, steps=steps, hidden=hidden,
                                          measure_tcp=measure_tcp)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    result = run_compression_bench(options)
    if as_json:
        print(json.dumps(result))
        return
    columns = ("ranks", "bits", "error_feedback", "wire_bytes_per_rank_per_step",
               "tcp_bytes_per_rank_per_step", "ratio_to_fp32", "relative_error",
               "sum_relative_error")
    typer.echo("  ".join(columns))
    for row in result["rows"]:
        typer.echo("  ".join(str(row[c]) for c in columns))
    typer.echo(json.dumps(result["flat"]))

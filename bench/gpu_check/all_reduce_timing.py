"""All-reduce of GPU tensors timed with CUDA events, checked for the right sum.

With two GPUs or more: NCCL, one rank on each of two GPUs. With one GPU, NCCL refuses two
ranks on it ("Duplicate GPU detected"), so the check times NCCL with one rank (its
kernels and launch, no exchange) and a two-process exchange of tensors on the same GPU
over gloo (staged through host memory).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dsec.bench.gpu_check.outcome import Outcome

MESSAGE_BYTES = (1 << 20, 64 << 20)
WARMUP_ITERATIONS = 3
TIMED_ITERATIONS = 10
RANKS_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Plan:
    backend: str
    world: int
    one_gpu: bool  # every rank on cuda:0


def plans(device_count: int, nccl: bool) -> list[Plan]:
    if device_count >= 2:
        return [Plan("nccl", 2, False)] if nccl else [Plan("gloo", 2, False)]
    return ([Plan("nccl", 1, True)] if nccl else []) + [Plan("gloo", 2, True)]


def bandwidth_figures(message_bytes: int, world: int, times_ms: list[float]) -> dict[str, Any]:
    """Median time and bandwidths: algorithm bandwidth is the message over the time; bus
    bandwidth scales it by what a ring sends, 2 (world - 1) / world (NCCL's convention)."""
    median_ms = statistics.median(times_ms)
    algorithm_gb_per_s = message_bytes / (median_ms / 1000.0) / 1e9
    return {
        "message_bytes": message_bytes,
        "median_ms": round(median_ms, 4),
        "min_ms": round(min(times_ms), 4),
        "algorithm_gb_per_s": round(algorithm_gb_per_s, 2),
        "bus_gb_per_s": round(algorithm_gb_per_s * 2 * (world - 1) / world, 2),
    }


def _rank_main(rank: int, plan: Plan, store: str, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0 if plan.one_gpu else rank)
    device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(plan.backend, init_method=f"file://{store}", rank=rank,
                            world_size=plan.world)
    try:
        results = []
        for message_bytes in MESSAGE_BYTES:
            tensor = torch.empty(message_bytes // 4, device=device)
            event_ms, host_ms, correct = [], [], True
            for iteration in range(WARMUP_ITERATIONS + TIMED_ITERATIONS):
                tensor.fill_(rank + 1.0)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                started = time.perf_counter()
                start.record()
                dist.all_reduce(tensor)
                end.record()
                end.synchronize()
                elapsed_host_ms = (time.perf_counter() - started) * 1000.0
                expected = plan.world * (plan.world + 1) / 2
                correct = correct and bool((tensor == expected).all())
                if iteration >= WARMUP_ITERATIONS:
                    event_ms.append(start.elapsed_time(end))
                    host_ms.append(elapsed_host_ms)
            figures = bandwidth_figures(message_bytes, plan.world, event_ms)
            figures["host_median_ms"] = round(statistics.median(host_ms), 4)
            figures["sum_correct"] = correct
            results.append(figures)
        if rank == 0:
            Path(out_path).write_text(json.dumps(results))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # NCCL's and gloo's threads can abort the interpreter's own exit; the figures are out
    os._exit(0)


def _run_plan(plan: Plan, folder: Path) -> dict[str, Any]:
    import torch.multiprocessing as mp

    name = f"{plan.backend}-{plan.world}"
    out_path = folder / f"{name}.json"
    context = mp.spawn(_rank_main, args=(plan, str(folder / f"{name}.store"), str(out_path)),
                       nprocs=plan.world, join=False)
    deadline_s = time.monotonic() + RANKS_TIMEOUT_S
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline_s:
                for process in context.processes:
                    process.kill()
                return {**asdict(plan), "error": f"ranks still running after "
                                                 f"{RANKS_TIMEOUT_S:.0f} s"}
    except Exception as exc:  # a rank raised: its message, not the whole traceback
        return {**asdict(plan), "error": str(exc).strip().splitlines()[-1][:300]}
    return {**asdict(plan), "sizes": json.loads(out_path.read_text())}


def check() -> Outcome:
    import torch
    import torch.distributed as dist

    device_count = torch.cuda.device_count()
    chosen = plans(device_count, dist.is_nccl_available())
    with tempfile.TemporaryDirectory(prefix="dsec-doctor-all-reduce-") as folder:
        runs = [_run_plan(plan, Path(folder)) for plan in chosen]
    problems = [f"{r['backend']} x{r['world']}: {r['error']}" for r in runs if "error" in r]
    problems += [f"{r['backend']} x{r['world']}: wrong sum at {s['message_bytes']} bytes"
                 for r in runs for s in r.get("sizes", []) if not s["sum_correct"]]
    figures: dict[str, Any] = {"device_count": device_count, "runs": runs}
    if device_count < 2:
        figures["note"] = ("one GPU: NCCL cannot put two ranks on it, so NCCL is timed with "
                           "one rank and the two-process exchange runs over gloo")
    return Outcome.judged(problems, figures)

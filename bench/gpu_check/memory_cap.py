"""The memory cap as the actuator applies it (``MemoryCap``, a per-process fraction of the
GPU), then respected: an allocation past it fails with an out-of-memory error that the
process catches, and the process goes on allocating under it."""

from __future__ import annotations

from typing import Any

from dsec.bench.gpu_check.outcome import Outcome

GIB = 1 << 30
CAP_BYTES = 4 * GIB
FREE_NEEDED_BYTES = 8 * GIB


def check() -> Outcome:
    import torch

    from dsec.actuators.memory_cap import MemoryCap
    from dsec.schemas.actuations import MemoryCapParams

    device = torch.cuda.current_device()
    free_bytes, total_bytes = torch.cuda.mem_get_info(device)
    if free_bytes < FREE_NEEDED_BYTES:
        return Outcome("skipped", f"{free_bytes / GIB:.1f} GiB free on cuda:{device}; the "
                                  f"check needs {FREE_NEEDED_BYTES / GIB:.0f}")
    figures: dict[str, Any] = {"cap_bytes": CAP_BYTES, "total_bytes": total_bytes}
    applied = MemoryCap().apply(MemoryCapParams(limit_bytes=CAP_BYTES))
    figures["apply_detail"] = getattr(applied, "now", applied)  # a set cap is watched on
    under = torch.empty(2 * GIB // 4, device=device)  # half the cap
    problems = []
    try:
        past = torch.empty(3 * GIB // 4, device=device)  # 5 GiB in all
        torch.cuda.synchronize()
        problems.append("an allocation past the cap succeeded")
        del past
    except torch.cuda.OutOfMemoryError as exc:
        figures["oom_message"] = str(exc).splitlines()[0][:200]
    figures["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    if figures["peak_reserved_bytes"] > CAP_BYTES:
        problems.append("the allocator held more than the cap")
    del under
    torch.cuda.empty_cache()
    try:
        again = torch.empty(3 * GIB // 4, device=device)
        again.fill_(1.0)
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        problems.append("after the failed allocation, 3 GiB under the 4 GiB cap did not fit")
    figures["oom_count"] = int(torch.cuda.memory_stats(device).get("num_ooms", 0))
    return Outcome.judged(problems, figures)

"""Precision switched by the actuator's controller on a real model while it trains:
bf16 -> fp16 (with a GradScaler) -> bf16 -> fp16. Each phase must run under the dtype it
asked for, with loss scaling exactly when fp16, every loss finite, and the model must
keep learning across the switches."""

from __future__ import annotations

import math
from typing import Any

from dsec.bench.gpu_check.outcome import Outcome

PHASES = ("bf16", "fp16", "bf16", "fp16")
STEPS_PER_PHASE = 25


def run(device: str = "cuda", steps_per_phase: int = STEPS_PER_PHASE, features: int = 256,
        hidden: int = 512, batch: int = 512) -> Outcome:
    import torch
    from torch import nn

    from dsec.actuators.precision import AutocastController
    from dsec.schemas.actuations import PrecisionParams

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.LayerNorm(hidden),
                          nn.Linear(hidden, features)).to(device)
    teacher = nn.Linear(features, features).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = torch.randn(batch, features, device=device)
    with torch.no_grad():
        targets = torch.tanh(teacher(inputs))
    expected = {"bf16": torch.bfloat16, "fp16": torch.float16}
    controller = AutocastController(device, PHASES[0])
    problems: list[str] = []
    phases: list[dict[str, Any]] = []
    for dtype in PHASES:
        detail = controller.apply(PrecisionParams(dtype=dtype))
        losses: list[float] = []
        dtypes: set[str] = set()
        for _ in range(steps_per_phase):
            optimizer.zero_grad(set_to_none=True)
            with controller():
                outputs = model(inputs)
                dtypes.add(str(outputs.dtype).removeprefix("torch."))
                loss = (outputs.float() - targets).pow(2).mean()
            controller.backward(loss)
            controller.step(optimizer)
            losses.append(float(loss.detach()))
        scaler = controller.scaler
        phases.append({
            "dtype": dtype, "detail": detail, "output_dtypes": sorted(dtypes),
            "loss_first": losses[0], "loss_last": losses[-1],
            "loss_scaling": scaler.is_enabled(),
            "scale": float(scaler.get_scale()) if scaler.is_enabled() else None,
        })
        if dtypes != {str(expected[dtype]).removeprefix("torch.")}:
            problems.append(f"{dtype} phase ran under {sorted(dtypes)}")
        if scaler.is_enabled() != (dtype == "fp16"):
            problems.append(f"{dtype} phase: loss scaling {'on' if scaler.is_enabled() else 'off'}")
        if not all(math.isfinite(value) for value in losses):
            problems.append(f"{dtype} phase: a loss was not finite")
    if not phases[-1]["loss_last"] < phases[0]["loss_first"]:
        problems.append("the loss did not fall across the switches")
    return Outcome.judged(problems, {"device": device, "steps_per_phase": steps_per_phase,
                                     "switches": controller.switches, "phases": phases})


def check() -> Outcome:
    return run("cuda")

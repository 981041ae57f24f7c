"""``dsec doctor --gpu``: does this host's GPU path work as dsec claims? One JSON object."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def doctor_command(
    gpu: Annotated[bool, typer.Option(
        "--gpu", help="Check NVML, CUDA memory, collectives, precision, snapshots and the "
                      "probe on this host's GPUs (a host without one says so per check).")
    ] = False,
    checks: Annotated[str | None, typer.Option(
        help="Comma-separated check names (default: all).")] = None,
    total_timeout_s: Annotated[float, typer.Option(
        min=10.0, help="Time for all checks together.")] = 280.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Check the real GPU paths; exits 1 when a check failed (skipped ones do not count)."""
    from dsec.bench.gpu_check import GpuCheckOptions, run_gpu_checks

    if not gpu:
        typer.echo("nothing to check: dsec doctor --gpu checks the GPU paths", err=True)
        raise typer.Exit(2)
    chosen = None if checks is None else tuple(c.strip() for c in checks.split(",") if c.strip())
    try:
        result = run_gpu_checks(GpuCheckOptions(checks=chosen, total_timeout_s=total_timeout_s))
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(result, default=str))
    else:
        for name, outcome in result["checks"].items():
            typer.echo(f"{name:>20}  {outcome['status']:<7}  {outcome.get('reason', '')}")
        typer.echo(f"{'':>20}  {json.dumps(result['summary'])}")
    if result["summary"]["failed"]:
        raise typer.Exit(1)

"""``dsec run [OPTIONS] -- COMMAND ...``: a program instrumented without a line of dsec in it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

RUN_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


def run_command(
    command: Annotated[list[str], typer.Argument(
        help="The program and its arguments, after --.", show_default=False)],
    endpoint: Annotated[str | None, typer.Option(
        help="Kafka bootstrap (kafka://host:9092 or host:9092); default DSEC_BOOTSTRAP.")]
    = None,
    worker_id: Annotated[str | None, typer.Option(
        help="This worker's id (default: sandbox, Ray or host name, with the rank).")] = None,
    sandbox_id: Annotated[str | None, typer.Option(help="The sandbox this worker runs in.")]
    = None,
    job_id: Annotated[str | None, typer.Option(help="The job (default DSEC_JOB_ID).")] = None,
    heartbeat_interval_s: Annotated[float | None, typer.Option(min=0.001)] = None,
    snapshots: Annotated[bool, typer.Option(
        help="Snapshot commands save the optimizers' parameters and state.")] = True,
    skip_nonfinite_steps: Annotated[bool, typer.Option(
        help="Skip every optimizer step whose gradients hold a NaN or an Inf.")] = False,
    config: Annotated[Path | None, typer.Option(
        "--config", exists=True, dir_okay=False,
        help="The dsec plugin entry (YAML or pyproject.toml); default ./dsec.yaml, "
             "./pyproject.toml [tool.dsec].")] = None,
) -> None:
    """Run COMMAND with every optimizer step, gradient norm, all-reduce, DDP bucket,
    gym.make environment, autocast region, CUDA memory and GPU reported, and commands
    applied at step boundaries, without changing it (also under torchrun)."""
    from dsec.zerotouch.config import ZeroTouchConfig
    from dsec.zerotouch.launch import LaunchError, run
    from dsec.zerotouch.plugin import PluginConfigError, read_config

    given = {"endpoint": endpoint, "worker_id": worker_id, "sandbox_id": sandbox_id,
             "job_id": job_id, "heartbeat_interval_s": heartbeat_interval_s}
    try:
        options = ZeroTouchConfig(**{k: v for k, v in given.items() if v is not None},
                                  **({} if snapshots else {"snapshots": False}),
                                  **({"skip_nonfinite_steps": True}
                                     if skip_nonfinite_steps else {}))
        run(command, read_config(config).merged(options))
    except (ValidationError, PluginConfigError, LaunchError) as exc:
        typer.echo(f"dsec run: {exc}", err=True)
        raise typer.Exit(2) from None

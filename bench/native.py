"""``dsec bench native``: nanoseconds per ``dsec_report_step`` call of ``libdsec_inject.so``,
side by side with its no-op build (the same exported calls with empty bodies).

Both libraries are loaded into one C program and report to a stub gateway on loopback
(their sender threads running); blocks of calls alternate between them (real-noop,
noop-real, ...), so drift and noise hit both alike. The figures are the medians over the
blocks; ``cost_ns`` is the difference, what a report adds to a call that does nothing.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from typing import Annotated, Any

import typer

from dsec.ingest.native.library import BUILD_DIR, LIBRARY_NAME

NATIVE_DIR = BUILD_DIR.parent


def run_native_bench(calls_per_block: int = 20_000, blocks: int = 21) -> dict[str, Any]:
    """Builds what the benchmark needs (make, the system compiler) and runs it."""
    built = subprocess.run(["make", "--no-print-directory", "-C", str(NATIVE_DIR), "bench"],
                           capture_output=True, text=True)
    if built.returncode != 0:
        raise RuntimeError(f"building the native benchmark failed:\n{built.stderr[-2000:]}")
    ran = subprocess.run(
        [str(BUILD_DIR / "bench_report"), str(BUILD_DIR / LIBRARY_NAME),
         str(BUILD_DIR / "libdsec_inject_noop.so"), str(calls_per_block), str(blocks)],
        capture_output=True, text=True, timeout=600,
        # the stub gateway is on loopback; the libraries log nothing when all goes well
        env={**os.environ, "DSEC_PROBE_BUFFER_MAX_SAMPLES": str(1 << 20)},
    )
    if ran.returncode != 0:
        raise RuntimeError(f"the native benchmark failed:\n{ran.stderr[-2000:]}")
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    result["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    return result


def native_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    calls_per_block: Annotated[int, typer.Option(min=1000)] = 20_000,
    blocks: Annotated[int, typer.Option(min=3, max=1000)] = 21,
) -> None:
    """ns per dsec_report_step of the C library, against its no-op build, side by side."""
    try:
        result = run_native_bench(calls_per_block, blocks)
    except RuntimeError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(result))
        return
    for name, value in result.items():
        typer.echo(f"{name:>20}  {value}")

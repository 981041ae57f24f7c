"""``dsec bench``: one sub-command per benchmark, each printing one JSON object with ``--json``."""

from __future__ import annotations

import typer

from dsec.bench.probe_overhead import probe_overhead

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks, measured side by side.")
bench_app.command("probe-overhead")(probe_overhead)

"""``dsec bench``: one sub-command per benchmark, each printing one JSON object with ``--json``."""

from __future__ import annotations

import typer

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks, measured side by side.")


from dsec.bench.snapshot import snapshot_command  # noqa: E402

bench_app.command("snapshot")(snapshot_command)

"""``dsec bench``: one sub-command per benchmark, each printing one JSON object with ``--json``."""

from __future__ import annotations

import typer

from dsec.bench.policy_eval import policy_eval

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks, measured side by side.")

bench_app.command("policy-eval")(policy_eval)

"""The ``dsec`` command line."""

from __future__ import annotations

import json
import logging
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dsec.bench.cli import bench_app
from dsec.gateway_cli import ingest_gateway
from dsec.settings import DsecSettings

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
schemas_app = typer.Typer(no_args_is_help=True, help="The wire contract.")
kafka_app = typer.Typer(no_args_is_help=True, help="The local Kafka broker.")
app.add_typer(schemas_app, name="schemas")
app.add_typer(kafka_app, name="kafka")
app.add_typer(bench_app, name="bench")
app.command("ingest-gateway")(ingest_gateway)
console = Console()
err_console = Console(stderr=True)


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


def _settings(**overrides: object) -> DsecSettings:
    given = {k: v for k, v in overrides.items() if v is not None}
    return DsecSettings(**given)


@app.command()
def up(
    bootstrap: Annotated[
        str | None, typer.Option(help="Use this Kafka instead of a local one.")
    ] = None,
    kafka_port: Annotated[int, typer.Option(help="Port of the local broker (0: any free).")] = 0,
    data_dir: Annotated[Path | None, typer.Option(help="Where the store and state live.")] = None,
) -> None:
    """Run the local stack (Kafka, stream jobs, policy engine, ClickHouse sink) until Ctrl-C."""
    from dsec.infra.stack import StackOptions, run_stack

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    settings = _settings(bootstrap=bootstrap, data_dir=data_dir)
    run_stack(settings, StackOptions(start_kafka=bootstrap is None, kafka_port=kafka_port))


@app.command()
def demo(
    workers: Annotated[int, typer.Option(min=1, max=64)] = 4,
    duration_s: Annotated[float, typer.Option(min=5.0)] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    data_dir: Annotated[Path | None, typer.Option()] = None,
) -> None:
    """Bring the stack up, train N small real RL workers for S seconds, tear down, summarise."""
    from dsec.demo.runner import DemoError, DemoOptions, run_demo

    settings = _settings(data_dir=data_dir)
    try:
        if as_json:
            summary = run_demo(settings, DemoOptions(workers=workers, duration_s=duration_s))
        else:
            with console.status(f"dsec demo: {workers} workers for {duration_s:.0f} s"):
                summary = run_demo(settings, DemoOptions(workers=workers, duration_s=duration_s))
    except DemoError as exc:
        err_console.print(f"[red]demo failed:[/red] {exc}")
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(summary))
        return
    table = Table(title=f"dsec demo {summary['job_id']}")
    table.add_column("what")
    table.add_column("count", justify="right")
    for name in ("metrics_stored", "features_stored", "actuations_emitted",
                 "actuations_applied", "dead_letters"):
        table.add_row(name, str(summary[name]))
    console.print(table)
    console.print(f"History in {summary['clickhouse']}; try: "
                  f"dsec sql \"SELECT kind, count() FROM raw_metrics GROUP BY kind\"")


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="A read-only ClickHouse SQL query.")],
    output: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    data_dir: Annotated[Path | None, typer.Option()] = None,
) -> None:
    """Query the stored history (running stack, embedded store, or DSEC_CLICKHOUSE_DSN)."""
    from dsec.history import HistoryError
    from dsec.history import query as query_history

    settings = _settings(data_dir=data_dir)
    try:
        result = query_history(settings, query)
    except HistoryError as exc:
        err_console.print(f"[red]query failed:[/red] {exc}")
        raise typer.Exit(1) from None
    if output is OutputFormat.json:
        print(json.dumps([dict(zip(result["columns"], row, strict=True))
                          for row in result["rows"]]))
        return
    table = Table()
    for column in result["columns"]:
        table.add_column(column)
    for row in result["rows"]:
        table.add_row(*(str(value) for value in row))
    console.print(table)


@schemas_app.command("export")
def schemas_export(directory: Path) -> None:
    """Write the JSON Schema of every wire model into DIRECTORY."""
    from dsec.schemas.export import export_json_schemas

    for path in export_json_schemas(directory):
        console.print(str(path))


@kafka_app.command("fetch")
def kafka_fetch() -> None:
    """Resolve the broker's jars from Maven Central into the cache (quick when cached)."""
    from dsec.infra.kafka_local import KAFKA_VERSION, fetch_jars

    console.print(f"Kafka {KAFKA_VERSION} jars in {fetch_jars()}")


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())

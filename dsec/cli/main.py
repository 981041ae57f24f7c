"""The ``dsec`` command line."""

from __future__ import annotations

import json
import logging
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dsec.bench.cli import bench_app
from dsec.cli.actuator import actuator_command
from dsec.cli.doctor import doctor_command
from dsec.cli.experiment import experiment_app
from dsec.cli.gateway import ingest_gateway
from dsec.cli.kafka import kafka_app
from dsec.cli.keys import keys_app
from dsec.cli.placement import placement_app
from dsec.cli.policy import policy_app
from dsec.cli.pool import pool_app
from dsec.cli.run import RUN_CONTEXT, run_command
from dsec.schemas.settings import DsecSettings

SINCE_HELP = "ISO time (UTC unless it names a zone), or a duration such as 2h or 30m."
app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
schemas_app = typer.Typer(no_args_is_help=True, help="The wire contract.")
app.add_typer(schemas_app, name="schemas")
app.add_typer(kafka_app, name="kafka")
app.add_typer(bench_app, name="bench")
app.command("actuator")(actuator_command)
app.add_typer(policy_app, name="policy")
app.add_typer(pool_app, name="pool")
app.add_typer(placement_app, name="placement")
app.add_typer(experiment_app, name="experiment")
app.add_typer(keys_app, name="keys")
app.command("ingest-gateway")(ingest_gateway)
app.command("run", context_settings=RUN_CONTEXT)(run_command)
app.command("doctor")(doctor_command)
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
        str | None, typer.Option(help="Use this Kafka instead of a local one (or DSEC_BOOTSTRAP).")
    ] = None,
    kafka_port: Annotated[int, typer.Option(help="Port of the local broker (0: any free).")] = 0,
    data_dir: Annotated[Path | None, typer.Option(help="Where the store and state live.")] = None,
    services: Annotated[
        str, typer.Option(help="Comma-separated: stream-jobs, policy-engine, sink, "
                               "alert-notifier.")
    ] = "stream-jobs,policy-engine,sink,alert-notifier",
) -> None:
    """Run the local stack (Kafka, stream jobs, policy engine, ClickHouse sink, alert
    notifier) until Ctrl-C."""
    from dsec.services.stack import StackOptions, run_stack

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    settings = _settings(bootstrap=bootstrap, data_dir=data_dir)
    chosen = frozenset(name.strip() for name in services.split(",") if name.strip())
    try:
        # A broker given either way is used; only with neither does the stack start its own.
        start_kafka = bootstrap is None and not os.environ.get("DSEC_BOOTSTRAP")
        run_stack(settings, StackOptions(start_kafka=start_kafka, kafka_port=kafka_port,
                                         services=chosen))
    except ValueError as exc:
        err_console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


@app.command()
def init(
    bootstrap: Annotated[str | None, typer.Option(help="Kafka bootstrap servers.")] = None,
    partitions: Annotated[
        int | None,
        typer.Option(min=1, help="Partitions of new non-compacted topics (bounds stream-job "
                                 "replicas); default each topic's own."),
    ] = None,
    replication_factor: Annotated[int | None, typer.Option(
        min=1, help="Of new topics; default DSEC_REPLICATION_FACTOR (1).")] = None,
    wait_s: Annotated[
        float, typer.Option(min=0.0, help="Keep retrying while Kafka or ClickHouse is away.")
    ] = 120.0,
) -> None:
    """Create dsec's topics and ClickHouse tables if missing, then exit (safe to rerun)."""
    import time

    from dsec.infra.store.clickhouse import connect, ensure_schema
    from dsec.infra.topics import ensure_topics

    settings = _settings(bootstrap=bootstrap)

    def make_topics() -> str:
        created = ensure_topics(settings, partitions,
                                replication_factor or settings.replication_factor,
                                timeout_s=max(5.0, min(30.0, wait_s)))
        return (f"topics on {settings.bootstrap}: "
                f"{'created ' + ', '.join(created) if created else 'all there'}")

    def make_tables() -> str:
        client = connect(settings.clickhouse_target())
        try:
            ensure_schema(client, settings.clickhouse_ttl_days)
        finally:
            client.close()
        return f"tables in {_redacted(settings.clickhouse_target())}: ready"

    deadline = time.monotonic() + wait_s
    for name, step in (("topics", make_topics), ("tables", make_tables)):
        while True:
            try:
                console.print(step())
                break
            except Exception as exc:
                if time.monotonic() >= deadline:
                    err_console.print(f"[red]init failed ({name}):[/red] {exc}")
                    raise typer.Exit(1) from None
                err_console.print(f"{name}: {exc}; retrying")
                time.sleep(2.0)


def _redacted(dsn: str) -> str:
    """The DSN without its password, for logs."""
    import re

    return re.sub(r"(//[^:/@]+:)[^@]*@", r"\1***@", dsn)


@app.command()
def health(
    url: Annotated[str | None, typer.Option(
        help="A /healthz URL (default: http://127.0.0.1:$DSEC_METRICS_PORT/healthz).")] = None,
    timeout_s: Annotated[float, typer.Option(min=0.1)] = 5.0,
) -> None:
    """Ask a dsec service whether it is healthy: exit 0 when it is, 1 otherwise."""
    from dsec.infra.observability.server import check_health

    if url is None:
        settings = _settings()
        if settings.metrics_port == 0:
            err_console.print("metrics are off (DSEC_METRICS_PORT=0): give --url")
            raise typer.Exit(1)
        url = settings.health_url()
    healthy, answer = check_health(url, timeout_s)
    print(answer)
    if not healthy:
        raise typer.Exit(1)


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
                 "actuations_applied", "actuations_not_applied", "dead_letters"):
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


@app.command()
def replay(
    trace: Annotated[Path, typer.Argument(exists=True, dir_okay=False,
                                          help="JSON lines of MetricBatch.")],
    speed: Annotated[float, typer.Option(min=0.0, help="1 = as recorded; 0 = at once.")] = 1.0,
    bootstrap: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Publish a recorded or synthetic trace to the metrics topic, keeping its timing."""
    from dsec.infra.kafka_clients import make_producer
    from dsec.infra.replay import read_lines
    from dsec.infra.replay import replay as publish
    from dsec.schemas import topic_names

    settings = _settings(bootstrap=bootstrap)
    producer = make_producer(settings, "dsec-replay")
    counters = publish(read_lines(trace), producer, topic_names(settings.topic_prefix).metrics,
                       speed)
    left = producer.flush(60)
    console.print(f"published {counters.published - left} batches"
                  + (f", skipped {counters.unreadable_lines} unreadable lines"
                     if counters.unreadable_lines else "")
                  + (f", [red]{left} not delivered[/red]" if left else ""))
    if left:
        raise typer.Exit(1)


@app.command("export")
def export_history(
    output: Annotated[Path, typer.Argument(dir_okay=False, help="JSON lines to write.")],
    since: Annotated[str, typer.Option(help=SINCE_HELP)],
    job: Annotated[str | None, typer.Option(help="Only this job.")] = None,
    data_dir: Annotated[Path | None, typer.Option()] = None,
) -> None:
    """Write stored raw samples back out as JSON lines that `dsec replay` reads."""
    from dsec.history import HistoryError, query
    from dsec.infra.store.export import export_batches

    settings = _settings(data_dir=data_dir)
    try:
        since_ms = _since_ms(since)
        written = 0
        with output.open("wb") as handle:
            for line in export_batches(lambda sql, params: query(settings, sql, params),
                                       since_ms, job):
                handle.write(line + b"\n")
                written += 1
    except (HistoryError, ValueError) as exc:
        err_console.print(f"[red]export failed:[/red] {exc}")
        raise typer.Exit(1) from None
    console.print(f"wrote {written} batches to {output}")


def _since_ms(since: str) -> int:
    from dsec.history_features import parse_since
    from dsec.schemas import now_ms

    return parse_since(since, now_ms())


report_app = typer.Typer(invoke_without_command=True,
                         help="The ready analysis queries, and what training cost.")
app.add_typer(report_app, name="report")


@report_app.callback()
def report(
    ctx: typer.Context,
    html_out: Annotated[Path | None, typer.Option("--html", help="Also write an HTML page.")]
    = None,
    data_dir: Annotated[Path | None, typer.Option()] = None,
) -> None:
    """Run the ready analysis queries and show them (and chart them with --html);
    `dsec report cost` for the cost of a period."""
    if ctx.invoked_subcommand is not None:
        return
    from dsec.history import HistoryError
    from dsec.report import render_html, run_report

    settings = _settings(data_dir=data_dir)
    try:
        results = run_report(settings)
    except HistoryError as exc:
        err_console.print(f"[red]report failed:[/red] {exc}")
        raise typer.Exit(1) from None
    for result in results:
        table = Table(title=result.query.title)
        for column in result.columns:
            table.add_column(column)
        for row in result.rows[:20]:
            table.add_row(*(str(v) for v in row))
        console.print(table if result.rows else f"[dim]{result.query.title}: no rows[/dim]")
    if html_out is not None:
        html_out.write_text(render_html(results))
        console.print(f"wrote {html_out}")


@report_app.command("cost")
def report_cost(
    since: Annotated[str, typer.Option(help=SINCE_HELP)]
    = "24h",
    html_out: Annotated[Path | None, typer.Option("--html", help="Also write an HTML page "
                                                  "with charts.")] = None,
    experiment: Annotated[Path | None, typer.Option(
        exists=True, dir_okay=False, help="A goodput experiment's result.json: its A/B "
        "return difference is the experiment's opportunity cost.")] = None,
    data_dir: Annotated[Path | None, typer.Option()] = None,
) -> None:
    """Explicit (GPU-hours per pool), hidden (the control plane, the probes) and
    opportunity (time degraded, the experiment's A/B difference) cost since SINCE; prices
    from DSEC_COST_GPU_HOUR, DSEC_COST_CPU_CORE_HOUR, DSEC_COST_MEMORY_GIB_HOUR."""
    from dsec.cli.cost import cost_tables
    from dsec.cost import cost_report, render_cost_html
    from dsec.history import HistoryError

    settings = _settings(data_dir=data_dir)
    try:
        result = cost_report(settings, _since_ms(since), experiment=experiment)
    except (HistoryError, ValueError) as exc:
        err_console.print(f"[red]cost report failed:[/red] {exc}")
        raise typer.Exit(1) from None
    tables = cost_tables(result)
    for title, (head, rows) in tables.items():
        table = Table(title=title)
        for column in head:
            table.add_column(column, justify="left" if column in ("pool", "service", "host",
                                                                 "mode", "what") else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table if rows else f"[dim]{title}: none[/dim]")
    if html_out is not None:
        html_out.write_text(render_cost_html(result, tables))
        console.print(f"wrote {html_out}")


@schemas_app.command("export")
def schemas_export(directory: Path) -> None:
    """Write the JSON Schema of every wire model into DIRECTORY."""
    from dsec.schemas.export import export_json_schemas

    for path in export_json_schemas(directory):
        console.print(str(path))


def main() -> None:
    app()


"""``dsec bench``: one sub-command per benchmark, each printing one JSON object with ``--json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dsec.bench import PIPELINE_SAMPLES
from dsec.bench.compression import compression
from dsec.bench.detection_workloads import FAULT_CLASSES, HELD_OUT_SEEDS, HELD_OUT_SHAPES
from dsec.bench.native import native_command
from dsec.bench.policy_eval import policy_eval
from dsec.bench.probe_overhead import probe_overhead
from dsec.bench.scale import scale
from dsec.bench.snapshot import snapshot_command

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks, measured side by side.")


def _print(result: dict, as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(result))
        return
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in result.items():
        table.add_row(name, f"{value:,}" if isinstance(value, int | float) else str(value))
    Console().print(table)


@bench_app.command("pipeline")
def pipeline(
    samples: Annotated[int, typer.Option(min=10_000)] = PIPELINE_SAMPLES,
    samples_per_message: Annotated[int, typer.Option(min=1)] = 1000,
    partitions: Annotated[int, typer.Option(min=1)] = 6,
    bootstrap: Annotated[str | None, typer.Option(help="Use this Kafka.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Stream jobs (features + ClickHouse sink) against a bare consumer, same topic."""
    from dsec.bench.pipeline import PipelineBenchOptions, run_pipeline_bench

    options = PipelineBenchOptions(samples=samples, samples_per_message=samples_per_message,
                                   partitions=partitions)
    _print(run_pipeline_bench(options, bootstrap), as_json, "dsec bench pipeline")


@bench_app.command("backlog")
def backlog(
    messages: Annotated[int, typer.Option(min=1)] = 1500,
    rows: Annotated[int, typer.Option(min=1, max=10_000)] = 1000,
    workers: Annotated[int, typer.Option(min=1)] = 10_000,
    bootstrap: Annotated[str | None, typer.Option(help="Use this Kafka.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The policy engine catching up on a backlog of feature columns, against the fleet's rate."""
    from dsec.bench.backlog import BacklogOptions, run_backlog_bench

    options = BacklogOptions(messages=messages, rows=rows, workers=workers)
    _print(run_backlog_bench(options, bootstrap), as_json, "dsec bench backlog")


@bench_app.command("store-layout")
def store_layout(
    messages: Annotated[int, typer.Option(min=2)] = 400,
    samples_per_message: Annotated[int, typer.Option(min=1)] = 1000,
    batch_messages: Annotated[int, typer.Option(min=1, help="Messages per insert.")] = 100,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The raw samples' storage, one row per sample against one row per message."""
    from dsec.bench.store_layout import StoreLayoutOptions, run_store_layout_bench

    options = StoreLayoutOptions(messages=messages, samples_per_message=samples_per_message,
                                 batch_messages=batch_messages)
    _print(run_store_layout_bench(options), as_json, "dsec bench store-layout")


@bench_app.command("reaction")
def reaction(
    trials: Annotated[int, typer.Option(min=1, help="Measured trials.")] = 30,
    warmup_trials: Annotated[int, typer.Option(
        min=1, help="Trials first, not counted, that wait out the stack's start.")] = 1,
    trial_timeout_s: Annotated[float, typer.Option(
        min=1.0, help="A trial not applied by then counts as missed.")] = 10.0,
    step_interval_ms: Annotated[float, typer.Option(
        min=1.0, help="The worker's step time: commands apply at step boundaries.")] = 10.0,
    bootstrap: Annotated[str | None, typer.Option(help="Use this Kafka.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """A metric sample over a policy's threshold to the command applied in the worker."""
    from dsec.bench.reaction import ReactionBenchError, ReactionBenchOptions, run_reaction_bench

    options = ReactionBenchOptions(trials=trials, warmup_trials=warmup_trials,
                                   trial_timeout_s=trial_timeout_s,
                                   step_interval_ms=step_interval_ms, bootstrap=bootstrap)
    try:
        result = run_reaction_bench(options)
    except ReactionBenchError as exc:
        typer.echo(f"dsec bench reaction failed: {exc}", err=True)
        raise typer.Exit(1) from None
    _print(result, as_json, "dsec bench reaction")


@bench_app.command("detection")
def detection(
    shapes: Annotated[str, typer.Option(
        help="Comma-separated workload shapes (default: the held-out ones).")] = ",".join(
        HELD_OUT_SHAPES),
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds (default: held out).")] = (
        ",".join(map(str, HELD_OUT_SEEDS))),
    workers: Annotated[int, typer.Option(min=2, help="Workers per trace.")] = 16,
    duration_s: Annotated[float, typer.Option(
        min=30.0, help="Real-time part of each trace (the faults begin in its first half).")
    ] = 240.0,
    preroll_s: Annotated[float, typer.Option(
        min=0.0, help="Healthy history published at once before it.")] = 600.0,
    interval_s: Annotated[float, typer.Option(
        min=0.1, help="Seconds between two messages of a worker.")] = 1.0,
    quiet: Annotated[bool, typer.Option(
        help="No faults: count the corrective commands on healthy workers.")] = False,
    bootstrap: Annotated[str | None, typer.Option(help="Use this Kafka.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Labelled faults in neutral traces, in real time through the whole stack, scored."""
    from dsec.bench.detection import (
        DetectionBenchError,
        DetectionBenchOptions,
        run_detection_bench,
    )

    try:
        options = DetectionBenchOptions(
            shapes=tuple(s.strip() for s in shapes.split(",") if s.strip()),
            seeds=tuple(int(s) for s in seeds.split(",") if s.strip()), workers=workers,
            duration_s=duration_s, preroll_s=preroll_s, interval_s=interval_s,
            faults=() if quiet else FAULT_CLASSES, bootstrap=bootstrap)
        options.specs()
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    try:
        result = run_detection_bench(options)
    except DetectionBenchError as exc:
        typer.echo(f"dsec bench detection failed: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(result))
        return
    _print({"f1": result["overall"]["f1"], "precision": result["overall"]["precision"],
            "recall": result["overall"]["recall"],
            "latency_p50_s": result["overall"]["latency_s"]["p50"],
            "corrective_commands_on_healthy_workers":
                result["corrective_commands_on_healthy_workers"]},
           False, "dsec bench detection")


@bench_app.command("fuzz")
def fuzz(
    seconds: Annotated[float, typer.Option(min=1.0, help="Seconds per target.")] = 60.0,
    target: Annotated[list[str] | None, typer.Option(
        help="packed-columns or policy (default: both).")] = None,
    engine: Annotated[str, typer.Option(
        help="auto (atheris when installed, else hypothesis), atheris or hypothesis.")] = "auto",
    artifacts: Annotated[Path | None, typer.Option(
        help="Where atheris writes the inputs it found (default: a temporary folder).")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The packed-column and policy decoders under a fuzzer for a fixed time each; exits 1
    when an input broke the rule (a crash, a hang, a disagreement, a refusal naming
    nothing)."""
    from dsec.bench.fuzz import TARGETS, FuzzOptions, run_fuzz

    try:
        options = FuzzOptions(seconds_per_target=seconds, targets=tuple(target or TARGETS),
                              engine=engine, artifacts_dir=artifacts)  # type: ignore[arg-type]
        result = run_fuzz(options, say=lambda line: typer.echo(line, err=True))
    except (ValueError, RuntimeError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(result))
    else:
        for name, run in result["targets"].items():
            typer.echo(f"{name}: {run['inputs']} inputs in {run['seconds']} s with "
                       f"{result['engine']}, {len(run['findings'])} findings")
            for finding in run["findings"]:
                typer.echo(f"  {finding['problem']}\n    input: {finding['input']}")
    if any(run["findings"] for run in result["targets"].values()):
        raise typer.Exit(1)


@bench_app.command("faults")
def faults(
    workers: Annotated[int, typer.Option(min=1, help="Synthetic workers publishing.")] = 8,
    warmup_s: Annotated[float, typer.Option(min=0.0, help="Steady load before the first kill."
                                            )] = 15.0,
    heap_mb: Annotated[int, typer.Option(min=256, help="Java heap of each Kafka node.")] = 384,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Three Kafka nodes under probe load: kill -9 the metrics leader, then the active
    controller, then the stream jobs, each restarted; samples sent, stored, lost, doubled
    and the time until the pipeline caught up. Exits 1 when a sample was lost or doubled."""
    from dsec.bench.faults import FaultsBenchError, FaultsOptions, run_faults_bench

    try:
        result = run_faults_bench(FaultsOptions(workers=workers, warmup_s=warmup_s,
                                                heap_mb=heap_mb),
                                  say=lambda line: typer.echo(line, err=True))
    except FaultsBenchError as exc:
        typer.echo(f"dsec bench faults failed: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    if result["samples_lost"] or result["samples_doubled"]:
        raise typer.Exit(1)


@bench_app.command("soak")
def soak(
    workers: Annotated[int, typer.Option(min=1, help="Synthetic workers.")] = 1000,
    duration_s: Annotated[float, typer.Option(min=10.0, help="How long they publish.")] = 600.0,
    load_processes: Annotated[int, typer.Option(min=1, help="Processes publishing for them."
                                                )] = 4,
    actuator_nodes: Annotated[int, typer.Option(min=0, help="Nodes with a node actuator.")
                              ] = 8,
    sample_interval_s: Annotated[float, typer.Option(min=1.0, help="RSS and lag every ...")
                                 ] = 10.0,
    bootstrap: Annotated[str | None, typer.Option(help="Use this Kafka.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Many workers at real probe rates through the whole stack: each service's RSS and
    each group's lag over time, samples in and stored, commands emitted and answered.
    Exits 1 when a sample was lost or doubled, or a service's RSS grew after warm-up."""
    from dsec.bench.soak import SoakBenchError, SoakOptions, run_soak

    options = SoakOptions(workers=workers, duration_s=duration_s,
                          load_processes=load_processes, actuator_nodes=actuator_nodes,
                          sample_interval_s=sample_interval_s, bootstrap=bootstrap)
    try:
        result = run_soak(options, say=lambda line: typer.echo(line, err=True))
    except SoakBenchError as exc:
        typer.echo(f"dsec bench soak failed: {exc}", err=True)
        raise typer.Exit(1) from None
    print(json.dumps(result) if as_json else json.dumps(result, indent=2))
    if result["samples_lost"] or result["samples_doubled"] or not result["rss_flat"]:
        raise typer.Exit(1)


bench_app.command("snapshot")(snapshot_command)
bench_app.command("policy-eval")(policy_eval)


@bench_app.command("signing")
def signing(
    commands: Annotated[int, typer.Option(min=100)] = 5_000,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Ed25519 sign and verify per command (key file, trust list file), against hmac-dev."""
    from dsec.bench.signing import signing_costs

    _print(signing_costs(commands), as_json, "dsec bench signing")


bench_app.command("probe-overhead")(probe_overhead)
bench_app.command("native")(native_command)
bench_app.command("compression")(compression)
bench_app.command("scale")(scale)


@bench_app.command("all")
def all_benchmarks(
    parts: Annotated[str | None, typer.Option(
        help="Comma-separated, of probe_overhead, pipeline, snapshot, policy_eval, reaction, "
             "compression, goodput (default: all).")] = None,
    probe_block_pairs: Annotated[int, typer.Option(min=1)] = 150,
    pipeline_samples: Annotated[int, typer.Option(min=10_000)] = PIPELINE_SAMPLES,
    snapshot_steps: Annotated[int, typer.Option(min=4)] = 24,
    policy_targets: Annotated[int, typer.Option(min=1)] = 10_000,
    reaction_trials: Annotated[int, typer.Option(min=1)] = 30,
    compression_steps: Annotated[int, typer.Option(min=1)] = 4,
    goodput_scenario: Annotated[str, typer.Option()] = "smoke",
    goodput_workers: Annotated[int, typer.Option(min=1)] = 2,
    goodput_duration_s: Annotated[float, typer.Option(min=10.0)] = 40.0,
    bootstrap: Annotated[str | None, typer.Option(help="Use this Kafka.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Every benchmark and a short goodput experiment: one object with all figures."""
    from dsec.bench.suite import PARTS, SuiteOptions, run_suite

    chosen = PARTS if parts is None else tuple(p.strip() for p in parts.split(",") if p.strip())
    try:
        options = SuiteOptions(
            parts=chosen, probe_block_pairs=probe_block_pairs, pipeline_samples=pipeline_samples,
            snapshot_steps=snapshot_steps, policy_targets=policy_targets,
            reaction_trials=reaction_trials, compression_steps=compression_steps,
            goodput_scenario=goodput_scenario,
            goodput_workers=goodput_workers, goodput_duration_s=goodput_duration_s,
            bootstrap=bootstrap)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    result = run_suite(options)
    print(json.dumps(result) if as_json else json.dumps(result, indent=2))
    if result["run"]["failed"]:
        raise typer.Exit(1)

"""``dsec experiment``: prove it — goodput with dsec against without and against the
best practice (asynchronous checkpoints, elastic restart), side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

experiment_app = typer.Typer(no_args_is_help=True, help=__doc__)
console = Console()
err_console = Console(stderr=True)

ARM_TITLES = {"plain": "plain (dsec observing)", "strong": "strong (async ckpt, elastic)"}


def _cell(arm: dict, name: str) -> str:
    """A measure, with its spread over seeds where there are several."""
    spread = arm.get(f"{name}_std")
    return str(arm.get(name)) if spread is None else f"{arm.get(name)} ± {spread}"


@experiment_app.command("goodput")
def goodput(
    scenario: Annotated[str, typer.Option(
        help="A scenario file, a ready one (quiet, bad-night, bad-night-2, leaky-cards, "
             "flaky-links, silent-nan, held-memory, stragglers, silent-hangs, flaky-cards, "
             "leaky-model, smoke), or 'random': one drawn per seed (docs/goodput.md).")
    ] = "bad-night",
    workers: Annotated[int, typer.Option(min=1, max=64)] = 8,
    duration_s: Annotated[float, typer.Option(min=10.0)] = 180.0,
    seeds: Annotated[str, typer.Option(
        "--seeds", "--seed", help="Comma-separated; one run per seed.")] = "0",
    workers_per_group: Annotated[int, typer.Option(min=1)] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    report: Annotated[Path | None, typer.Option(help="Write an HTML report here.")] = None,
    bootstrap: Annotated[str | None, typer.Option(
        help="Use this Kafka instead of starting one.")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="Where timelines and logs go.")] = None,
    cpu_slowdown: Annotated[float, typer.Option(
        min=1.0, help="Every worker's CPU work takes K times as long (a slower host).")] = 1.0,
    time_scale: Annotated[str, typer.Option(
        help="Stretch every wall-clock span of the scenario and the run by this factor, "
             "or 'auto': by this host's measured update time over the reference host's, "
             "so faults last as many steps on any host.")] = "1",
    arms: Annotated[str, typer.Option(
        help="Comma-separated arms to run (plain, strong, dsec); fewer arms, less CPU.")
    ] = "plain,strong,dsec",
    placement: Annotated[str, typer.Option(
        help="On a scenario with a fleet (leaky-model): 'on', the restarter asks the "
             "recommendation API where a restarted worker goes; 'off', it comes back on its "
             "own card; 'both', a run of each per seed.")] = "off",
) -> None:
    """Run the simulated cluster three times at once under the same faults and seeds:
    plain (dsec observing only), strong (observing only; asynchronous checkpoints and an
    elastic restart) and dsec acting; print the arms side by side."""
    from dsec.experiment.faults import load_scenario
    from dsec.experiment.random_scenario import RANDOM, random_scenario
    from dsec.experiment.runner import ExperimentError, GoodputOptions, run_goodput

    try:
        chosen = random_scenario(0) if scenario == RANDOM else load_scenario(scenario)
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
        scale = None if time_scale == "auto" else float(time_scale)
        arm_list = tuple(a.strip() for a in arms.split(",") if a.strip())
        settings = PLACEMENT_SETTINGS[placement]
        GoodputOptions(arms=arm_list)  # the arms checked before anything starts
    except KeyError:
        err_console.print(f"[red]--placement must be on, off or both; got {placement}[/red]")
        raise typer.Exit(2) from None
    except (FileNotFoundError, ValueError) as exc:
        err_console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    runs: dict[bool, list[dict]] = {on: [] for on in settings}
    for seed in seed_list:
        if scenario == RANDOM:
            chosen = random_scenario(seed)
        for on in settings:
            folder = f"seed-{seed}" + ("" if len(settings) == 1 else
                                       f"-placement-{'on' if on else 'off'}")
            options = GoodputOptions(
                workers=workers, duration_s=duration_s, workers_per_group=workers_per_group,
                seed=seed, bootstrap=bootstrap, cpu_slowdown=cpu_slowdown, time_scale=scale,
                run_dir=None if run_dir is None else run_dir / folder, arms=arm_list,
                placement=on)
            try:
                if as_json:
                    runs[on].append(run_goodput(chosen, options))
                else:
                    with console.status(f"goodput: {chosen.name}, {workers} workers x "
                                        f"{len(arm_list)} arms, {duration_s:.0f} s, seed "
                                        f"{seed}, placement {'on' if on else 'off'}"):
                        runs[on].append(run_goodput(chosen, options))
            except ExperimentError as exc:
                err_console.print(f"[red]experiment failed:[/red] {exc}")
                raise typer.Exit(1) from None
    if len(settings) == 2:
        if report is not None:
            _write_placement_reports(report, runs, as_json)
        _print_placement(runs[False], runs[True], arm_list, as_json)
        return
    (runs_of_setting,) = runs.values()
    _print_goodput(runs_of_setting, chosen.name if scenario != RANDOM else RANDOM, workers,
                   duration_s, seeds, as_json, report)


PLACEMENT_SETTINGS = {"off": (False,), "on": (True,), "both": (False, True)}


def _print_goodput(runs: list[dict], name: str, workers: int, duration_s: float, seeds: str,
                   as_json: bool, report: Path | None) -> None:
    from dsec.experiment.arms import arms_of
    from dsec.experiment.report import NUMERIC, write_report

    result = _combined(runs)
    if report is not None:
        write_report(report, result, runs)
    if as_json:
        print(json.dumps(result))
        return
    table = Table(title=f"goodput on {name}: {workers} workers, {duration_s:.0f} s, "
                        f"seeds {seeds}")
    table.add_column("measure")
    for arm in arms_of(result):
        table.add_column(ARM_TITLES.get(arm, arm), justify="right")
    for name in (*NUMERIC, "degraded_s"):
        table.add_row(name, *(_cell(result[arm], name) for arm in arms_of(result)))
    console.print(table)
    if report is not None:
        console.print(f"report: {report}")


def _combined(runs: list[dict]) -> dict:
    """One run as it is; several seeds' runs as their means, spreads and each seed's own."""
    from dsec.experiment.report import combine_seeds

    return runs[0] if len(runs) == 1 else combine_seeds(runs)


def _write_placement_reports(report: Path, runs: dict[bool, list[dict]],
                             as_json: bool) -> None:
    """One report per setting, beside the path asked for: ``NAME-placement-off.html`` and
    ``NAME-placement-on.html``."""
    from dsec.experiment.report import write_report

    for on, setting_runs in runs.items():
        path = report.with_name(f"{report.stem}-placement-{'on' if on else 'off'}"
                                f"{report.suffix}")
        write_report(path, _combined(setting_runs), setting_runs)
        if not as_json:
            console.print(f"report: {path}")


def _print_placement(off: list[dict], on: list[dict], arms: tuple[str, ...],
                     as_json: bool) -> None:
    """Interruptions and restarts on the leaky model without and with placement, per seed
    and arm: the same seeds, the same faults, the same first cards."""
    from dsec.experiment.report import placement_rows

    rows = placement_rows(off, on, arms)
    if as_json:
        print(json.dumps({"placement": rows, "off": off, "on": on}))
        return
    table = Table(title="interruptions without and with placement, same seeds")
    for column in ("seed", "arm", "interruptions off/on", "restarts off/on",
                   "restarts on the leaky model off/on"):
        table.add_column(column)
    for row in rows:
        table.add_row(str(row["seed"]), row["arm"],
                      f"{row['interruptions_off']}/{row['interruptions_on']}",
                      f"{row['restarts_off']}/{row['restarts_on']}",
                      f"{row['restarts_on_leaky_model_off']}/{row['restarts_on_leaky_model_on']}")
    console.print(table)


@experiment_app.command("placement")
def placement(
    seeds: Annotated[str, typer.Option(help="Comma-separated; both arms per seed.")] = "1,2,3",
    steps: Annotated[int, typer.Option(min=100)] = 4000,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Restarts with and without placement, on a fleet where one simulated GPU model leaks
    on long episodes: the restarter asks the recommendation API where a worker goes."""
    from dsec.experiment.placement_run import PlacementScenario, run_placement_arms

    results = run_placement_arms(PlacementScenario(steps=steps),
                                 [int(seed) for seed in seeds.split(",")])
    if as_json:
        print(json.dumps(results))
        return
    table = Table(title="interruptions (OOMs) with and without placement, same seeds")
    for column in ("seed", "without", "with", "restarts on the leaky model without/with",
                   "productive steps without/with"):
        table.add_column(column)
    for row in results:
        off, on = row["without"], row["with"]
        table.add_row(str(row["seed"]), str(off["interruptions"]), str(on["interruptions"]),
                      f"{off['restarts_on_leaky_model']}/{on['restarts_on_leaky_model']}",
                      f"{off['productive_steps']}/{on['productive_steps']}")
    console.print(table)
